"""Compression choices for ``horovod_accordion.torch``, named as in Horovod.

``Compression.none`` and ``Compression.fp16`` are plain Horovod compressors: they work
with stock ``hvd.DistributedOptimizer(compression=...)`` too. ``Compression.powersgd``
and ``Compression.topk`` describe switchable compressors for Accordion.
"""

import torch
from horovod.torch.compression import Compressor

from horovod_accordion.compression import PowerSGD, TopK, cast_compressor

__all__ = ["Compression", "NoneCompressor", "FP16Compressor"]


class NoneCompressor(Compressor):
    """Default no-op compression."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
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

    @staticmethod
    def cast(dtype):
        """The compressor that sends gradients as ``dtype`` (torch.float16 or torch.float32)."""
        return cast_compressor(str(dtype).replace("torch.", ""),
                               {"float16": FP16Compressor, "float32": NoneCompressor})
