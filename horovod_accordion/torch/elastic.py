"""``hvd.elastic`` for Accordion: Horovod's elastic API, with Accordion's optimizer state
committed, restored and synchronised like the rest.

Importing it (``horovod_accordion.torch`` does) registers a state handler for Accordion's
optimizers in Horovod's ``TorchState``, so ``hvd.elastic.TorchState(model=..., optimizer=...)``
needs no change:

- ``commit()`` keeps a copy of the optimizer's ``state_dict()``: levels, detector, Q,
  counters, and this process's error-feedback memory, residuals and Δ;
- after a failure, ``restore()`` goes back to it. Each surviving process keeps its own
  memory, whatever rank it has in the new world; a rank that joins starts from zero;
- ``sync()`` broadcasts rank 0's shared state with ``broadcast_optimizer_state``, which
  never steps a fresh optimizer (Horovod's would: a phantom, collective ``step()`` on the
  joining worker alone). Averaging factors follow the new world size by themselves: every
  collective asks the process set for its size.
"""
from horovod.torch.elastic import *  # noqa: F401,F403 - run, TorchState, ElasticSampler
from horovod.torch.elastic import state as _state

from horovod_accordion.torch.optimizer import AccordionOptimizer
from horovod_accordion.torch.optimizer_state import broadcast_optimizer_state


class AccordionOptimizerStateHandler(_state.OptimizerStateHandler):
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


if not any(handler is AccordionOptimizerStateHandler for _, handler in _state.get_handler_registry()):
    # First match wins, and Accordion's optimizers are torch optimizers too.
    _state.set_handler_registry([(AccordionOptimizer, AccordionOptimizerStateHandler)]
                                + _state.get_handler_registry())
