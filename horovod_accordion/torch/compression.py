"""Compression choices for ``horovod_accordion.torch``, named as in Horovod.

``Compression.none`` and ``Compression.fp16`` are Horovod compressors (``Compressor``
subclasses): they work with stock ``hvd.DistributedOptimizer(compression=...)`` too.
``Compression.powersgd``, ``.topk`` and ``.quantized`` describe switchable compressors for
Accordion. The maths are ``horovod_accordion.torch_common.compression``'s, which the DDP hook shares.
"""

from horovod.torch.compression import Compressor

from horovod_accordion.torch_common import compression as torch_compression

__all__ = ["Compression", "NoneCompressor", "FP16Compressor"]


class NoneCompressor(torch_compression.NoneCompressor, Compressor):
    """Default no-op compression."""


class FP16Compressor(torch_compression.FP16Compressor, Compressor):
    """Floating-point tensors travel as fp16 and are cast back to their dtype."""


class Compression(torch_compression.Compression):
    """Optional gradient compression algorithm used during allreduce.

    Attributes:
        none: Horovod's: gradients travel as they are.
        fp16: Horovod's: floating-point gradients travel as fp16.
        powersgd: ``Compression.powersgd(low_rank, high_rank=None, ...)``: PowerSGD at rank ``low_rank``
            in critical regimes and ``high_rank`` elsewhere (one rank: static); see
            ``horovod_accordion.core.reducers``.
        topk: ``Compression.topk(low_fraction, high_fraction=None)``: the largest ``low_fraction`` of
            each layer's gradient in critical regimes, ``high_fraction`` elsewhere, with error feedback.
        quantized: ``Compression.quantized(low_bits, high_bits=None, block_size=64)``: blockwise
            integer quantization, exchanged in two shots (an all-to-all and an all-gather) with
            error feedback at both quantizations.
    """

    none = NoneCompressor
    fp16 = FP16Compressor
