"""Keras 3 callbacks: ``AccordionCallback``, and Horovod's ``BroadcastGlobalVariablesCallback``,
which ``horovod.tensorflow.keras`` cannot provide under Keras 3."""

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from horovod_accordion.tensorflow.keras_callback import AccordionCallbackMixin

__all__ = ["AccordionCallback", "BroadcastGlobalVariablesCallback"]


class AccordionCallback(AccordionCallbackMixin, keras.callbacks.Callback):
    __doc__ = AccordionCallbackMixin.__doc__
    schedule_type = keras.optimizers.schedules.LearningRateSchedule


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Horovod's: every rank starts from ``root_rank``'s model and optimizer variables.

    Keras 3 builds the optimizer before ``fit`` calls its callbacks, so the broadcast happens
    at the start of training, not after the first batch as in Horovod's."""

    def __init__(self, root_rank, device=''):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        variables = [*self.model.variables, *self.model.optimizer.variables]
        with tf.device(self.device):
            for k, variable in enumerate(variables):
                variable.assign(hvd.broadcast(tf.convert_to_tensor(variable), self.root_rank,
                                              name=f"keras3.broadcast.{k}"))
        self.broadcast_done = True
