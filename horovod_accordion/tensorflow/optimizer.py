"""``DistributedOptimizer`` for tf_keras optimizers: ``fit`` and custom loops alike.

With a plain compressor it is ``horovod.tensorflow.keras.DistributedOptimizer``. With
PowerSGD, TopK or Quantized it subclasses the user's optimizer class (as Horovod does) and
averages the gradients in ``apply_gradients`` through an ``AccordionState``
(``keras_optimizer``).
"""

import tensorflow as tf
import horovod.tensorflow as hvd

from horovod_accordion.core.compression import SWITCHABLE
from horovod_accordion.core.policies import make_policy
from horovod_accordion.tensorflow.keras_optimizer import AccordionOptimizer, accordion_keras_optimizer, deserializers

__all__ = ["DistributedOptimizer", "load_model", "tensorflow_distributed_optimizer"]


class _Keras2Optimizer(AccordionOptimizer):
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads, variables = zip(*list(grads_and_vars))
        return self.accordion_apply(
            grads, variables, lambda averaged: super(_Keras2Optimizer, self).apply_gradients(
                zip(averaged, variables), *args, **kwargs))


def _require_keras2(optimizer):
    import tf_keras
    bases = (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer)
    if not isinstance(optimizer, bases):
        raise ValueError(
            f"{type(optimizer).__module__}.{type(optimizer).__name__} is not a tf_keras (Keras 2) optimizer. "
            f"Horovod's Keras integration, and Accordion's, need Keras 2: Keras 3 breaks it (horovod#4290). "
            f"Set TF_USE_LEGACY_KERAS=1 before importing TensorFlow, pip install tf-keras, and build the "
            f"model and optimizer with tf.keras (or tf_keras); or, with Keras 3, use "
            f"horovod_accordion.keras3.DistributedOptimizer.")


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=hvd.Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=hvd.Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=hvd.global_process_set, scale_local_gradients=True, *,
                         eta=0.5, interval=10, window_steps=None, per_layer=True, lr_decay_factor=2.0,
                         delta_windows=1, check_norm="local", verify_levels=None, log_path=None,
                         tensorboard_dir=None, batch_switch=None, policy="accordion"):
    """Wrap a tf_keras ``optimizer`` so that ``apply_gradients`` averages over ranks.

    The arguments up to ``scale_local_gradients`` are Horovod's, with its defaults.
    Accordion's (``eta`` … ``log_path``) are those of ``AccordionState``; add
    ``horovod_accordion.keras.AccordionCallback`` to ``fit`` so that epochs close the
    detection windows and learning-rate decays reach the detector. With ``batch_switch``
    (a ``BatchSwitch``), Accordion switches between 1 and m micro-batches (``fit`` batches)
    per communication instead of the compression level; ``compression`` stays fixed.
    With ``Compression.none`` or ``fp16`` and neither ``log_path`` nor ``tensorboard_dir``,
    this is Horovod's own optimizer; with either, Accordion's, which records the traffic.
    Accordion's has no ``device_dense``, ``device_sparse``, ``num_groups``, ``groups`` or
    ``scale_local_gradients``: set away from Horovod's defaults, they raise a ``ValueError``;
    sparse gradients need ``sparse_as_dense=True``.
    """
    arguments = dict(locals())
    _require_keras2(optimizer)
    # Plain none or fp16 is Horovod's own optimizer, unless a traffic record is asked for: then
    # it runs through Accordion's exchange, so that a baseline logs as the compressed runs do.
    records = log_path is not None or tensorboard_dir is not None
    if batch_switch is None and not isinstance(compression, SWITCHABLE) and not records \
            and not make_policy(policy).weighs_costs:  # such a policy is refused by Accordion's, not ignored
        import horovod.tensorflow.keras as hvd_keras  # Keras 2 only (horovod#4290): imported where used
        return hvd_keras.DistributedOptimizer(
            optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
            compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups, groups=groups,
            process_set=process_set, scale_local_gradients=scale_local_gradients)
    instead = "" if isinstance(compression, SWITCHABLE) or batch_switch is not None else \
        ", or drop log_path and tensorboard_dir to get Horovod's own optimizer"
    return accordion_keras_optimizer(_Keras2Optimizer, instead=instead, **arguments)


def tensorflow_distributed_optimizer(optimizer, name=None, use_locking=False, device_dense='', device_sparse='',
                                     compression=hvd.Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                                     op=hvd.Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                                     num_groups=0, groups=None, process_set=hvd.global_process_set,
                                     scale_local_gradients=True, **accordion_options):
    """``horovod.tensorflow.DistributedOptimizer``, with its arguments and defaults, exported as
    ``horovod_accordion.tensorflow.DistributedOptimizer``: a tf_keras optimizer gets
    ``DistributedOptimizer`` (Accordion's keyword arguments included), and a
    ``tf.compat.v1.train.Optimizer`` gets Horovod's own, whose compressors are the plain ones:
    PowerSGD, TopK and Quantized keep state across steps, which Accordion keeps in the tape
    (``DistributedGradientTape(accordion=...)``) or in a tf_keras optimizer.
    ``use_locking`` is passed to Horovod's v1 optimizer; Keras optimizers have no such option."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if isinstance(compression, SWITCHABLE) or accordion_options:
            raise ValueError(
                f"a tf.compat.v1 optimizer takes Horovod's plain compressions only (none, fp16), without "
                f"Accordion's options{' ' + str(sorted(accordion_options)) if accordion_options else ''}: for "
                f"PowerSGD, TopK, Quantized or Accordion, use a tf_keras optimizer or "
                f"DistributedGradientTape(accordion=...)")
        return hvd.DistributedOptimizer(
            optimizer, name=name, use_locking=use_locking, device_dense=device_dense, device_sparse=device_sparse,
            compression=compression, sparse_as_dense=sparse_as_dense,
            backward_passes_per_step=backward_passes_per_step, op=op,
            gradient_predivide_factor=gradient_predivide_factor,
            average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups, groups=groups,
            process_set=process_set, scale_local_gradients=scale_local_gradients)
    return DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse, compression=compression,
        sparse_as_dense=sparse_as_dense, gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step, average_aggregated_gradients=average_aggregated_gradients,
        num_groups=num_groups, groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients,
        **accordion_options)


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=hvd.Compression.none,
               legacy_opts=False, **accordion_options):
    """``horovod.tensorflow.keras.load_model`` with Accordion's optimizer: load a tf_keras model
    saved with its optimizer, and wrap that optimizer in ``DistributedOptimizer`` with
    ``compression`` and Accordion's keyword arguments (``eta``, ``interval``, ...).

    The model's weights and the optimizer's slots come back. So does Accordion's state from a
    native ``.keras`` file, where the optimizer saves it beside its own variables: training
    continues exactly. An ``.h5`` file has no room for it, so there the levels restart at
    ℓ_low until the first check.
    """
    import tf_keras
    base = tf_keras.optimizers.legacy.Optimizer if legacy_opts else tf_keras.optimizers.Optimizer

    # h5 files name a built-in optimizer in lower case, .keras files by its class name.
    objects = deserializers([*base.__subclasses__(), *(custom_optimizers or ())], DistributedOptimizer, compression,
                            accordion_options)
    objects.update(custom_objects or {})
    return tf_keras.models.load_model(filepath, custom_objects=objects)
