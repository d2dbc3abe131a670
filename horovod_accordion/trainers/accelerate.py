"""Accordion in Hugging Face Accelerate: one call after ``accelerator.prepare``.

::

    from horovod_accordion.accelerate import register_accordion
    from horovod_accordion.ddp import AccordionState, PowerSGD

    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    state = register_accordion(accelerator, model, AccordionState(compression=PowerSGD(2, 1)), optimizer)
    for epoch in ...:
        ...                 # your loop: accelerator.backward(loss), optimizer.step(), scheduler.step()
        state.end_epoch()   # on every rank; or window_steps=N

``DistributedDataParallelKwargs(comm_hook=...)`` takes only Accelerate's own hooks (an enum),
so the hook goes on the DDP model that ``prepare`` returns.
"""

import os

import torch
from torch.nn.parallel import DistributedDataParallel

from horovod_accordion.trainers.common import EveryRankState, attach

__all__ = ["register_accordion"]


def register_accordion(accelerator, model, state, optimizer=None):
    """Register ``state``'s hook on ``model``, the DDP model ``accelerator.prepare`` returned,
    and return the state. On every rank (a collective: the cross-rank check).

    - the layers are named after the unwrapped model's parameters;
    - with ``optimizer`` (the prepared one), the hook reads its learning rate before each
      step, as the scheduler left it; without, call ``state.observe_lr(lr)`` before each step;
    - with ``mixed_precision="fp16"``, the state takes ``accelerator.scaler``, whose loss scale
      the gradients carry;
    - ``accelerator.save_state`` / ``load_state`` keep every rank's state (the error-feedback
      memories are each rank's own) in the checkpoint folder, beside the model's.

    A model that ``prepare`` did not wrap in DDP (one process) is a ``TypeError``: launch 2
    or more processes, and on a machine without GPUs build ``Accelerator(cpu=True)``.
    """
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if not isinstance(model, DistributedDataParallel) and launched > 1 and not torch.cuda.is_available():
        raise TypeError(f"this process is one of {launched} launched, but Accelerator() on a machine without GPUs "
                        f"trains each process alone, without DDP, so there is nothing to compress: build "
                        f"Accelerator(cpu=True), which trains the {launched} processes together over Gloo")
    attach(model, state, named_by=accelerator.unwrap_model(model), optimizer=optimizer,
           grad_scaler=accelerator.scaler)
    accelerator.register_for_checkpointing(EveryRankState(state))
    return state
