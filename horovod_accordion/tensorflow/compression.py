"""Compression choices for ``horovod_accordion.tensorflow`` and ``.keras``, named as in Horovod.

``Compression.none`` and ``Compression.fp16`` are Horovod's own TensorFlow compressors;
``powersgd`` and ``topk`` describe Accordion's switchable compressors.
"""
import tensorflow as tf
import horovod.tensorflow as hvd

from horovod_accordion.core.compression import PowerSGD, TopK, cast_compressor

__all__ = ["Compression"]


class Compression:
    """Optional gradient compression algorithm used during allreduce."""

    none = hvd.Compression.none
    fp16 = hvd.Compression.fp16
    powersgd = PowerSGD
    topk = TopK

    @staticmethod
    def cast(dtype):
        """The compressor that sends gradients as ``dtype`` (tf.float16 or tf.float32)."""
        return cast_compressor(tf.as_dtype(dtype).name, {"float16": hvd.Compression.fp16,
                                                         "float32": hvd.Compression.none})
