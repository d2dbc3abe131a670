"""Compression choices for torch, named as in Horovod: those of ``horovod_accordion.torch``
and of the DDP hook (``horovod_accordion.ddp``).

``Compression.none`` and ``Compression.fp16`` are plain compressors in Horovod's interface:
``compress`` gives the tensor that goes on the wire and what restores it, ``decompress``
restores it. They import no Horovod, so the DDP hook and the advisor's profile send with them
where Horovod is not built; ``horovod_accordion.torch`` adds Horovod's ``Compressor`` base to
them. ``powersgd``, ``topk`` and ``quantized`` describe Accordion's switchable compressors.
"""

import torch

from horovod_accordion.core.compression import SWITCHABLE, PowerSGD, Quantized, TopK, cast_compressor

__all__ = ["Compression", "FP16Compressor", "NoneCompressor", "PlainCompressor", "check_hook_compression",
           "compression_levels", "is_plain"]


class PlainCompressor:
    """A compressor with no levels: the gradient itself on the wire, perhaps cast."""


def is_plain(compression):
    """Whether ``compression`` is a plain compressor class (none, fp16), which has no levels."""
    return isinstance(compression, type) and issubclass(compression, PlainCompressor)


def compression_levels(compression):
    """(ℓ_low, ℓ_high) of ``compression``; ``(None, None)`` for none and fp16."""
    return (None, None) if is_plain(compression) else tuple(compression.levels)


def check_hook_compression(compression):
    """The compressions a torch.distributed hook (DDP's, FSDP's) takes, or a ``ValueError``."""
    if not (isinstance(compression, SWITCHABLE) or is_plain(compression)):
        raise ValueError(f"compression must be Compression.none, Compression.fp16, PowerSGD(low_rank, high_rank), "
                         f"TopK(low_fraction, high_fraction) or Quantized(low_bits, high_bits), got {compression!r}")


class NoneCompressor(PlainCompressor):
    """Default no-op compression."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(PlainCompressor):
    """Floating-point tensors travel as fp16 and are cast back to their dtype."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx) if ctx.is_floating_point else tensor


class Compression:
    """Optional gradient compression algorithm used during allreduce."""

    none = NoneCompressor
    fp16 = FP16Compressor
    powersgd = PowerSGD
    topk = TopK
    quantized = Quantized

    @classmethod
    def cast(cls, dtype):
        """The compressor that sends gradients as ``dtype`` (torch.float16 or torch.float32)."""
        return cast_compressor(str(dtype).replace("torch.", ""), {"float16": cls.fp16, "float32": cls.none})
