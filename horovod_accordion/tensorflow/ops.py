"""The TensorFlow collectives of ``horovod_accordion.core.reducers``: Horovod's collectives, as graph
ops, over the TensorFlow tensor maths (``horovod_accordion.tensorflow.tensors``).
"""

import tensorflow as tf
import horovod.tensorflow as hvd

from horovod_accordion.core.arguments import under_elastic
from horovod_accordion.core.collectives import Done, Traffic, wire_share
from horovod_accordion.core.process_sets import HorovodProcessSetCollectives

__all__ = ["TensorFlowCollectives"]


class TensorFlowCollectives(HorovodProcessSetCollectives):
    horovod_module = hvd
    as_tensor = staticmethod(tf.constant)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Counted by the traced step: a variable, read between steps.
        self.bytes_sent = tf.Variable(0, dtype=tf.int64, trainable=False, name="accordion_bytes_sent")
        self.wire_bytes_sent = tf.Variable(0, dtype=tf.float64, trainable=False, name="accordion_wire_bytes_sent")

    # Collectives: one fused call per phase; each counts the bytes this rank contributes.
    def size(self):
        """Under ``hvd.elastic``, a graph op that reads the world size when the step runs, as
        Horovod's own TF code does: Keras keeps its traced step across resets, and a size traced
        as a number would stay the old world's (TopK's wire way, the allgather's rows, Sum)."""
        if under_elastic():
            return hvd.size_op(process_set_id=self.process_set.process_set_id)
        return super().size()

    def start_allreduce_mean(self, flat, name, compression=None):
        """A graph op, done when started (TF runs it when its inputs are ready): the grouped
        allreduce of ``start_allreduce_means`` with one member, so compression, the wire dtype,
        the byte count and the pre/post-scaling are written once."""
        return Done(self._start_allreduce_means([flat], name, compression).wait()[0])

    def _start_allreduce_means(self, tensors, name, compression=None):
        """Each of ``tensors`` averaged over ranks by one grouped allreduce, as Horovod's tape does:
        Horovod fuses them in its own buffer, where a concatenation here would copy every
        gradient twice more."""
        if not tensors:
            return Done([])
        compression = compression or hvd.Compression.none
        wires = [compression.compress(tf.cast(tensor, self.tensors.wire_dtype(tensor))) for tensor in tensors]
        self._count_bytes(tf.add_n([tf.cast(tf.size(wire), tf.int64) * wire.dtype.size for wire, _ in wires]),
                          "allreduce")
        reduced = hvd.grouped_allreduce([wire for wire, _ in wires], name=f"{self.name_prefix}.{name}", op=hvd.Average,
                                        prescale_factor=1.0 / self.gradient_predivide_factor,
                                        postscale_factor=self.gradient_predivide_factor, process_set=self.process_set)
        return Done([tf.cast(compression.decompress(value, ctx), tensor.dtype)
                      for value, (_, ctx), tensor in zip(reduced, wires, tensors)])

    def _start_allgather(self, flat, name):
        """Every rank's 1-D ``flat``, as shape (size, len)."""
        self._count(flat, "allgather")
        gathered = hvd.allgather(flat, name=f"{self.name_prefix}.{name}", process_set=self.process_set)
        return Done(tf.reshape(gathered, [self.size(), -1]))

    def _start_alltoall(self, rows, name):
        """Row j of ``rows`` (one per rank) to rank j; the rows received, row r from rank r."""
        self._count(rows, "alltoall")
        received = hvd.alltoall(rows, name=f"{self.name_prefix}.{name}", process_set=self.process_set)
        return Done(tf.reshape(received, rows.shape))  # static: a traced step knows no received length

    def _count(self, tensor, collective):
        self._count_bytes(tf.cast(tf.size(tensor), tf.int64) * tensor.dtype.size, collective)

    def _count_bytes(self, handed, collective):
        """As ``Collectives.count``, in the traced step, at the world size when the step runs."""
        self.bytes_sent.assign_add(handed)
        share = wire_share(collective, tf.cast(self.size(), tf.float64))
        self.wire_bytes_sent.assign_add(share * tf.cast(handed, tf.float64))

    def take_traffic(self):
        traffic = Traffic(int(self.bytes_sent.numpy()), round(float(self.wire_bytes_sent.numpy())))
        self.bytes_sent.assign(0)
        self.wire_bytes_sent.assign(0)
        return traffic
