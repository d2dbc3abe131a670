"""Compression choices for ``horovod_accordion.torch``, named as in Horovod.

``Compression.none`` and ``Compression.fp16`` are plain Horovod compressors: they work
with stock ``hvd.DistributedOptimizer(compression=...)`` too. ``Compression.powersgd``
and ``Compression.topk`` describe switchable compressors for Accordion.
"""

import torch
from horovod.torch.compression import Compressor

from horovod_accordion.compression import PowerSGD, TopK

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


_CASTS = {torch.float16: FP16Compressor, torch.float32: NoneCompressor}


class Compression:
    """Optional gradient compression algorithm used during allreduce."""

    none = NoneCompressor
    fp16 = FP16Compressor
    powersgd = PowerSGD
    topk = TopK

    @staticmethod
    def cast(dtype):
        """The compressor that sends gradients as ``dtype`` (torch.float16 or torch.float32)."""
        if dtype == torch.bfloat16:
            raise ValueError(
                "bf16 gradient compression is not available: Horovod 0.28.1 rejects bf16 allreduce. "
                "Use Compression.fp16 (with gradient_predivide_factor if fp16 sums overflow); bf16 "
                "parameters are supported and their gradients travel as fp32.")
        if dtype not in _CASTS:
            raise ValueError(f"unknown compression dtype {dtype!r}; choose torch.float16 or torch.float32")
        return _CASTS[dtype]
