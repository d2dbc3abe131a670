"""Horovod's Keras callbacks, plus ``AccordionCallback``, which runs Accordion's
bookkeeping around ``model.fit``."""

import tensorflow as tf
import tf_keras
import horovod.tensorflow.keras.callbacks as _horovod_callbacks
from horovod.tensorflow.keras.callbacks import *  # noqa: F401,F403 - hvd.callbacks.* as in Horovod


def _with_keras2_backend(horovod_callback):
    """Horovod 0.28.1 hands its callbacks ``from keras import backend``, which is Keras 3's
    under TF >= 2.16 and has no ``get_value``/``set_value``; the learning-rate callbacks
    then fail on the first batch. Rebind tf_keras's backend."""
    class Keras2Callback(horovod_callback):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.backend = tf_keras.backend

    Keras2Callback.__name__ = Keras2Callback.__qualname__ = horovod_callback.__name__
    Keras2Callback.__doc__ = horovod_callback.__doc__
    return Keras2Callback


def _with_momentum_check(horovod_callback):
    """Horovod's momentum correction sets the optimizer's momentum variable each batch. The
    tf_keras optimizers that are not ``legacy`` hold it as a Python float, baked into the
    traced step, and Horovod failed on it with "'float' object has no attribute 'dtype'"."""
    class LearningRateCallback(horovod_callback):
        def on_train_begin(self, logs=None):
            momentum = getattr(self.model.optimizer, "momentum", None)
            if self.momentum_correction and isinstance(momentum, (int, float)):
                if momentum:
                    raise ValueError(
                        f"{horovod_callback.__name__}'s momentum correction needs the momentum as a variable, "
                        f"and {type(self.model.optimizer).__name__} holds it as the float {momentum}: use "
                        f"tf_keras.optimizers.legacy.{type(self.model.optimizer).__name__}, or pass "
                        f"momentum_correction=False")
                self.momentum_correction = False  # no momentum: nothing to correct
            super().on_train_begin(logs)

    LearningRateCallback.__name__ = LearningRateCallback.__qualname__ = horovod_callback.__name__
    LearningRateCallback.__doc__ = horovod_callback.__doc__
    return LearningRateCallback


BroadcastGlobalVariablesCallback = _with_keras2_backend(_horovod_callbacks.BroadcastGlobalVariablesCallback)
MetricAverageCallback = _with_keras2_backend(_horovod_callbacks.MetricAverageCallback)
LearningRateScheduleCallback = _with_momentum_check(
    _with_keras2_backend(_horovod_callbacks.LearningRateScheduleCallback))
LearningRateWarmupCallback = _with_momentum_check(_with_keras2_backend(_horovod_callbacks.LearningRateWarmupCallback))

__all__ = ["AccordionCallback"]


class AccordionCallback(tf_keras.callbacks.Callback):
    """Feeds the learning rate to the detector before each batch, records each step's
    traffic after it, and closes the detection window at each epoch end.

    Put it after any callback that sets the learning rate (``LearningRateScheduler``,
    Horovod's ``LearningRateWarmupCallback``); it works beside
    ``BroadcastGlobalVariablesCallback`` and ``MetricAverageCallback``. With
    ``tensorboard_dir``, rank 0 writes Accordion's scalars there (bytes per step, each
    layer's level and ratio per check), beside Keras's own ``TensorBoard`` callback.
    """

    def __init__(self, optimizer=None, tensorboard_dir=None):
        super().__init__()
        self._optimizer = optimizer
        self._tensorboard_dir = tensorboard_dir

    @property
    def state(self):
        optimizer = self._optimizer or self.model.optimizer
        return getattr(optimizer, "accordion_state", None)

    def on_train_begin(self, logs=None):
        optimizer = self._optimizer or self.model.optimizer
        optimizer._accordion_callback = self  # windows will close: no warning at the first step
        if getattr(optimizer, "_accordion_options", {}).get("batch_switch") is None:
            return
        # Batch switching counts every micro-batch, the first included: create the state now.
        if not self.model.built:
            raise ValueError("batch_switch needs the model built before fit(): give the first layer an "
                             "input_shape, or call model.build()")
        optimizer.accordion_state_for(self.model.trainable_variables)

    def current_lr(self):
        optimizer = self._optimizer or self.model.optimizer
        schedule_type = tf_keras.optimizers.schedules.LearningRateSchedule
        # The new optimizers' learning_rate is the rate of the *last* step when it comes from
        # a schedule; the schedule itself gives the rate of the step about to run.
        lr = getattr(optimizer, "_learning_rate", None)
        if not isinstance(lr, schedule_type):
            lr = optimizer.learning_rate
        if isinstance(lr, schedule_type):
            lr = lr(optimizer.iterations)
        return float(tf.convert_to_tensor(lr).numpy())

    def on_train_batch_begin(self, batch, logs=None):
        state = self.state
        if state is None:  # created by the first apply_gradients
            return
        if state.batch_switch is not None:
            state.begin_micro_batch(self.current_lr())
        else:
            state.observe_lr(self.current_lr())

    def on_train_batch_end(self, batch, logs=None):
        state = self.state
        if state is None:
            return
        if self._tensorboard_dir is not None:  # the state exists once the first batch has run
            state.write_tensorboard(self._tensorboard_dir)
            self._tensorboard_dir = None
        if state.batch_switch is not None:
            state.end_micro_batch()
        else:
            state.step_end()

    def on_epoch_end(self, epoch, logs=None):
        state = self.state
        if state is None:
            return
        if state.window_steps is None:
            state.end_epoch()
