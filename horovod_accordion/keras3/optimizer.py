"""``DistributedOptimizer`` for Keras 3 optimizers, on the TensorFlow backend.

It subclasses the user's optimizer class and averages in ``apply``, which both ``fit``
(through ``apply_gradients``) and a custom loop call, through an ``AccordionState``
(``horovod_accordion.tensorflow.keras_optimizer``). Every compression, ``none`` and ``fp16``
included, runs through Accordion's exchange: Horovod's Keras optimizer is not there to fall
back on.
"""

import horovod.tensorflow as hvd
import keras

from horovod_accordion.tensorflow.keras_optimizer import AccordionOptimizer, accordion_keras_optimizer, deserializers

__all__ = ["DistributedOptimizer", "load_model"]


class _Keras3Optimizer(AccordionOptimizer):
    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            if not self.built:
                raise ValueError("apply(grads) without the variables needs the optimizer built: call "
                                 "optimizer.build(trainable_variables) first")
            trainable_variables = self._trainable_variables
        variables = list(trainable_variables)
        return self.accordion_apply(
            list(grads), variables, lambda averaged: super(_Keras3Optimizer, self).apply(averaged, variables))


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=hvd.Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=hvd.Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=hvd.global_process_set, scale_local_gradients=True, *,
                         eta=0.5, interval=10, window_steps=None, per_layer=True, lr_decay_factor=2.0,
                         delta_windows=1, check_norm="local", verify_levels=None, log_path=None,
                         tensorboard_dir=None, batch_switch=None, policy="accordion"):
    """Wrap a Keras 3 ``optimizer`` so that ``apply`` (and so ``apply_gradients`` and ``fit``)
    averages over ranks.

    The arguments are those of ``horovod_accordion.keras.DistributedOptimizer``, Horovod's
    first, with its defaults. Add ``AccordionCallback`` to ``fit`` so that epochs close the
    detection windows and learning-rate decays reach the detector. Keras 3's own
    ``gradient_accumulation_steps`` is refused: use ``backward_passes_per_step``, which
    communicates once per step instead of once per micro-batch.
    """
    arguments = dict(locals())
    if keras.backend.backend() != "tensorflow":
        raise ValueError(f"Accordion's Keras 3 optimizer runs on the TensorFlow backend (KERAS_BACKEND=tensorflow), "
                         f"not {keras.backend.backend()!r}: its collectives are horovod.tensorflow's")
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError("mixed precision (LossScaleOptimizer) is not supported: it checks each rank's own, "
                         "unaveraged gradients for inf, so one rank could skip a step, and its collectives, "
                         "that another takes")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(
            f"{type(optimizer).__module__}.{type(optimizer).__name__} is not a Keras 3 optimizer: for tf_keras "
            f"(Keras 2, TF_USE_LEGACY_KERAS=1), use horovod_accordion.keras.DistributedOptimizer")
    if optimizer.gradient_accumulation_steps:
        raise ValueError(
            f"gradient_accumulation_steps={optimizer.gradient_accumulation_steps} would exchange every "
            f"micro-batch's gradients: pass backward_passes_per_step={optimizer.gradient_accumulation_steps} "
            f"to DistributedOptimizer instead, which sums them locally and exchanges once per step")
    return accordion_keras_optimizer(_Keras3Optimizer, **arguments)


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=hvd.Compression.none,
               **accordion_options):
    """``keras.models.load_model`` with Accordion's optimizer: the model comes back with its
    weights, and with its optimizer wrapped in ``DistributedOptimizer`` (``compression`` and
    Accordion's keyword arguments: ``eta``, ``interval``, ...), its variables restored. A file
    saved with Accordion's optimizer also restores Accordion's state, saved beside them, and
    training continues exactly; one saved with a plain optimizer starts Accordion afresh."""
    optimizers = [cls for cls in vars(keras.optimizers).values()
                  if isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer)]
    objects = deserializers([*optimizers, *(custom_optimizers or ())], DistributedOptimizer, compression,
                            accordion_options)
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    plain = getattr(model, "optimizer", None)
    if plain is None or isinstance(plain, AccordionOptimizer):
        return model
    # Keras 3 deserializes a built-in optimizer saved by its own name past custom_objects:
    # wrap it here, with the variables it loaded, and compile the model with the wrapped one.
    wrapped = DistributedOptimizer(plain, compression=compression, **accordion_options)
    if plain.built:
        wrapped.build(model.trainable_variables)
        for mine, loaded in zip(wrapped.variables, plain.variables):
            mine.assign(loaded)
    compiled = keras.saving.deserialize_keras_object(model.get_compile_config())
    model.compile(**dict(compiled, optimizer=wrapped))
    return model
