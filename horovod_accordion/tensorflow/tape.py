"""``DistributedGradientTape``: Horovod's, with an ``AccordionState`` doing the exchange."""

import tensorflow as tf
import horovod.tensorflow as hvd

from horovod_accordion.core.compression import SWITCHABLE

__all__ = ["DistributedGradientTape"]


class _AccordionGradientTape(tf.GradientTape):
    def gradient(self, target, sources, output_gradients=None, unconnected_gradients=tf.UnconnectedGradients.NONE):
        sources = list(sources)
        self._accordion.check_variables(sources)
        grads = super(self.__class__, self).gradient(target, sources, output_gradients, unconnected_gradients)
        return self._accordion.reduce(grads)


def DistributedGradientTape(gradtape, device_dense='', device_sparse='', compression=hvd.Compression.none,
                            sparse_as_dense=False, op=hvd.Average, gradient_predivide_factor=1.0,
                            num_groups=0, groups=None, process_set=hvd.global_process_set,
                            scale_local_gradients=True, accordion=None):
    """A tape whose ``gradient()`` averages the gradients over ranks.

    Without ``accordion`` it is ``horovod.tensorflow.DistributedGradientTape`` with the same
    arguments. With ``accordion=AccordionState(variables, compression=...)``, created once
    outside ``tf.function``, the gradients go through Accordion's compressors; the
    compression and Horovod options are then the state's.
    """
    if accordion is None:
        if isinstance(compression, SWITCHABLE):
            raise ValueError(
                "PowerSGD, TopK and Quantized keep state across steps: create hvd.AccordionState(variables, "
                "compression=...) once, outside tf.function, and pass it as accordion=")
        return hvd.DistributedGradientTape(
            gradtape, device_dense=device_dense, device_sparse=device_sparse, compression=compression,
            sparse_as_dense=sparse_as_dense, op=op, gradient_predivide_factor=gradient_predivide_factor,
            num_groups=num_groups, groups=groups, process_set=process_set,
            scale_local_gradients=scale_local_gradients)
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,), dict(_AccordionGradientTape.__dict__))
    tape = cls(gradtape._persistent, gradtape._watch_accessed_variables)
    tape._tape = gradtape._tape  # the recording already made, as Horovod's wrapper does
    tape._recording = gradtape._recording
    tape._accordion = accordion
    return tape
