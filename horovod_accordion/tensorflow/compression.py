"""Compression choices for ``horovod_accordion.tensorflow`` and ``.keras``, named as in Horovod.

``Compression.none`` and ``Compression.fp16`` are Horovod's own TensorFlow compressors;
``powersgd``, ``topk`` and ``quantized`` describe Accordion's switchable compressors.
"""
import tensorflow as tf
import horovod.tensorflow as hvd

from horovod_accordion.core.compression import PowerSGD, Quantized, TopK, cast_compressor

__all__ = ["Compression", "check_traceable"]


def check_traceable(compression):
    """A ``ValueError`` for a ``Quantized`` that switches bits: a traced TF step keeps the bits it
    was traced with (its wire's shape follows them), so a switch would be ignored."""
    if isinstance(compression, Quantized) and len(set(compression.levels)) > 1:
        raise ValueError(
            f"{compression!r} switches levels, which TensorFlow cannot yet: a traced step keeps the bits it was "
            f"traced with. Use one level, Quantized({compression.low_bits}), or PowerSGD or TopK to switch")


class Compression:
    """Optional gradient compression algorithm used during allreduce."""

    none = hvd.Compression.none
    fp16 = hvd.Compression.fp16
    powersgd = PowerSGD
    topk = TopK
    quantized = Quantized  # one level only (a traced step keeps the bits it was traced with)

    @staticmethod
    def cast(dtype):
        """The compressor that sends gradients as ``dtype`` (tf.float16 or tf.float32)."""
        return cast_compressor(tf.as_dtype(dtype).name, {"float16": hvd.Compression.fp16,
                                                         "float32": hvd.Compression.none})
