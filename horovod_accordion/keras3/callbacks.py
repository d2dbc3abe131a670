"""Keras 3 callbacks: ``AccordionCallback``, and Horovod's ``BroadcastGlobalVariablesCallback``,
which ``horovod.tensorflow.keras`` cannot provide under Keras 3."""

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from horovod_accordion.tensorflow.keras_callback import AccordionCallbackMixin
from horovod_accordion.tensorflow.keras_optimizer import build_weights

__all__ = ["AccordionCallback", "BroadcastGlobalVariablesCallback"]


class AccordionCallback(AccordionCallbackMixin, keras.callbacks.Callback):
    __doc__ = AccordionCallbackMixin.__doc__
    schedule_type = keras.optimizers.schedules.LearningRateSchedule

    def on_train_begin(self, logs=None):
        if isinstance(self.model.optimizer, keras.optimizers.LossScaleOptimizer):
            # compile() wraps the optimizer itself under a mixed_float16 policy.
            raise ValueError("mixed precision (a mixed_float16 policy, LossScaleOptimizer) is not supported with "
                             "Accordion's optimizer: the loss scale checks each rank's own gradients for inf, so "
                             "one rank could skip a step, and its collectives, that another takes")
        super().on_train_begin(logs)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Horovod's: every rank continues from ``root_rank``'s model and optimizer variables.

    As soon as they all exist: at the start of training if the model is built (it has an
    ``Input``), the optimizer then built on every rank; else after the first batch, which
    builds both, as Horovod's does."""

    def __init__(self, root_rank, device=''):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.model.built:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        self._broadcast()

    def _broadcast(self):
        if self.broadcast_done:
            return
        # Every rank builds its optimizer first: else a rank that restored a checkpoint alone
        # would hold more variables than the others, and the broadcasts would not pair up.
        build_weights(self.model.optimizer, self.model.trainable_variables)
        with tf.device(self.device):
            for k, variable in enumerate([*self.model.variables, *self.model.optimizer.variables]):
                variable.assign(hvd.broadcast(tf.convert_to_tensor(variable), self.root_rank,
                                              name=f"keras3.broadcast.{k}"))
        self.broadcast_done = True
