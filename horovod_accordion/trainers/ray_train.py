"""Accordion in Ray Train (``ray[train]`` 2.x): two calls in ``train_loop_per_worker``.

::

    from horovod_accordion.ddp import AccordionState, PowerSGD
    from horovod_accordion.ray_train import prepare_accordion, report

    def train_loop_per_worker(config):
        model = ray.train.torch.prepare_model(model)            # the DDP model
        state = prepare_accordion(model, AccordionState(compression=PowerSGD(2, 1)), optimizer)
        for epoch in ...:
            ...                                                 # your steps
            state.end_epoch()                                   # on every worker; or window_steps=N
            report(state, {"loss": loss}, checkpoint_dir=...)   # instead of ray.train.report

Ray's ``TorchTrainer`` has no comm-hook option, so the hook goes on the model that
``prepare_model`` returns. Every worker saves its own Accordion state into the checkpoint
(the error-feedback memories are each rank's own); Ray gathers the workers' files into one
checkpoint, and ``prepare_accordion`` gives each worker its own back on a restart.
"""

import os
import pathlib
import re
import warnings

import ray.train
import torch

from horovod_accordion.trainers.common import EveryRankState, attach, step_metrics

__all__ = ["prepare_accordion", "report"]

_FILE = "accordion-rank{}.pt"


def prepare_accordion(model, state, optimizer=None, checkpoint=None):
    """Register ``state``'s hook on ``model``, the DDP model ``ray.train.torch.prepare_model``
    returned, name the layers after its parameters, and return the state. With ``optimizer``,
    the hook reads its learning rate before each step (as the scheduler left it); without,
    call ``state.observe_lr(lr)``. This worker's Accordion state is loaded from
    ``checkpoint`` (a ``ray.train.Checkpoint``, for a new run that starts from an old one's:
    Ray Train V2 has no ``resume_from_checkpoint``), else from ``ray.train.get_checkpoint()``
    when Ray restores a failed run. On every worker: a collective."""
    attach(model, state, optimizer=optimizer)
    checkpoint = checkpoint or ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            saved = {int(re.search(r"(\d+)\.pt$", path.name)[1]): path
                     for path in pathlib.Path(directory).glob(_FILE.format("*"))}
            if not saved:
                warnings.warn("the checkpoint Ray resumes from holds no Accordion state (accordion-rank*.pt): "
                              "Accordion starts afresh (levels, detector, error feedback)")
            else:
                EveryRankState(state).load_state_dict([
                    torch.load(saved[rank], weights_only=True, map_location="cpu") if rank in saved else None
                    for rank in range(max(saved) + 1)])
    return state


def report(state, metrics, checkpoint_dir=None, levels=True):
    """``ray.train.report`` on every worker, with Accordion's metrics of the last step added
    (``accordion/bytes``, and ``accordion/level/<parameter>`` with ``levels``). With
    ``checkpoint_dir``, a folder this worker filled with its own files for the checkpoint
    (or an empty one), this worker's Accordion state is saved into it and the folder
    reported as a ``ray.train.Checkpoint``."""
    checkpoint = None
    if checkpoint_dir is not None:
        rank = ray.train.get_context().get_world_rank()
        torch.save(state.state_dict(), os.path.join(checkpoint_dir, _FILE.format(rank)))
        checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir)
    ray.train.report(dict(metrics, **step_metrics(state, levels)), checkpoint=checkpoint)
