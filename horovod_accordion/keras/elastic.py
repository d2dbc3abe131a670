"""``hvd.elastic`` for tf_keras, with Accordion's state committed, restored and synchronised.

Horovod's ``KerasState`` keeps the model's and the optimizer's variables; Accordion's state
(levels, detector, Q, error-feedback memory, counters) lives beside them, so this
``KerasState`` adds it:

- ``commit()`` snapshots it in memory; ``restore()`` after a failure goes back to it, so each
  surviving worker keeps its own memory, whatever its new rank;
- ``sync()`` checks that every rank has the same variables and gives all of them rank 0's
  levels, detector, Q and counters (a joining worker starts with zero memory).

It also builds the optimizer's slots at once, so that a joining worker broadcasts the same
optimizer variables as the others. Horovod's ``KerasState`` calls ``optimizer.variables()``,
which needs a legacy tf_keras optimizer (``tf_keras.optimizers.legacy.SGD``).

``run`` replaces Horovod 0.28.1's TensorFlow one, which returns ``None`` from the training
function, as if it had finished, on any ``UnknownError`` that does not name one of three ops.
"""
from horovod.common.elastic import run_fn
from horovod.common.exceptions import HorovodInternalError
from horovod.tensorflow.elastic import _reset
from horovod.tensorflow.keras.elastic import *  # noqa: F401,F403 - the state callbacks
from horovod.tensorflow.keras.elastic import KerasState as _HorovodKerasState
from tensorflow.errors import OpError

from horovod_accordion.tensorflow.keras_optimizer import build_weights


def run(func):
    """``hvd.elastic.run``: a collective that failed because a worker left raises
    ``HorovodInternalError``, so the state is restored and training resumes; any other error
    propagates."""
    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except OpError as error:
            if "Horovod" in error.message:
                raise HorovodInternalError(error) from error
            raise

    return run_fn(wrapper, _reset)


class KerasState(_HorovodKerasState):
    """``hvd.elastic.KerasState(model, optimizer=None, **kwargs)``, with Accordion's state."""

    def __init__(self, model, optimizer=None, **kwargs):
        optimizer = optimizer or model.optimizer
        self._accordion = None
        if hasattr(optimizer, "accordion_state_for"):  # Accordion's optimizer, not a plain Horovod one
            build_weights(optimizer, model.trainable_variables)
            self._accordion = optimizer.accordion_state_for(model.trainable_variables)
        super().__init__(model, optimizer=optimizer, **kwargs)

    def save(self):
        if self._accordion is not None:
            self._accordion_snapshot = self._accordion.snapshot()
        super().save()

    def restore(self):
        if self._accordion is not None:
            self._accordion.load_snapshot(self._accordion_snapshot)
        super().restore()

    def sync(self):
        if self._accordion is not None:
            self._accordion.check_same_variables_on_all_ranks()
            self._accordion.broadcast_shared_state(root_rank=0)
            self._accordion_snapshot = self._accordion.snapshot()
        super().sync()
