"""Horovod's Keras callbacks, plus ``AccordionCallback``, which runs Accordion's
bookkeeping around ``model.fit``."""

import tf_keras
import horovod.tensorflow.keras.callbacks as _horovod_callbacks
from horovod.tensorflow.keras.callbacks import *  # noqa: F401,F403 - hvd.callbacks.* as in Horovod

from horovod_accordion.tensorflow.keras_callback import AccordionCallbackMixin


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


class AccordionCallback(AccordionCallbackMixin, tf_keras.callbacks.Callback):
    __doc__ = AccordionCallbackMixin.__doc__
    schedule_type = tf_keras.optimizers.schedules.LearningRateSchedule
