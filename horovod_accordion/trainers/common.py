"""What the trainer integrations share: hooking a state onto the DDP model a trainer built,
and checkpoints that one rank writes for all.

A trainer (Lightning, Accelerate, Ray Train) wraps the model in ``DistributedDataParallel``
itself, and most of them save a checkpoint from the first rank only. Accordion's
error-feedback memories and detection window are each rank's own, so the checkpoint holds
every rank's state dict and each rank loads its own.
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from horovod_accordion.hooks.ddp_state import accordion_hook
from horovod_accordion.torch_common.tensors import map_leaves

__all__ = ["EveryRankState", "attach", "step_metrics"]


def attach(ddp_model, state, named_by=None, optimizer=None, grad_scaler=None):
    """Make ``state``'s hook run on ``ddp_model``, the DDP module the trainer built: register
    it unless the trainer did (Lightning's ``DDPStrategy(ddp_comm_state=state, ...)`` on
    CUDA), then bind the state to the parameters, named as in ``named_by`` (the user's
    module; by default ``ddp_model``'s), and to ``optimizer`` if given (the hook reads its
    learning rate). ``grad_scaler``: the trainer's ``GradScaler``, if it owns one (fp16 AMP),
    whose loss scale the gradients carry. A collective (``state.bind``): call it on every rank."""
    if not isinstance(ddp_model, DistributedDataParallel):
        raise TypeError(f"Accordion averages gradients in a DistributedDataParallel communication hook, and this "
                        f"model is a {type(ddp_model).__name__}: train with the trainer's DDP (Lightning's "
                        f"strategy='ddp', 2 or more processes of Accelerate or Ray Train)")
    registered = getattr(ddp_model, "_comm_hooks", [])  # (hook, state) pairs, torch 2.x's own list
    if not any(hooked_state is state for _, hooked_state in registered):
        if registered:
            raise RuntimeError(f"this DDP model already runs the communication hook "
                               f"{registered[0][0].__qualname__}, and DDP runs one: Accordion's would never run. "
                               f"Drop the other hook (ddp_comm_hook=...)")
        ddp_model.register_comm_hook(state, accordion_hook)
    state._hook_watch.registered = True
    if grad_scaler is not None:
        state.grad_scaler = grad_scaler
    state.bind(named_by if named_by is not None else ddp_model, optimizer)


def step_metrics(state, levels=True):
    """What a trainer's logger gets after each step: this rank's bytes of the step, handed to the
    collectives (``accordion/bytes``) and across its link (``accordion/wire_bytes``), and, with
    ``levels``, each compressed layer's level (``accordion/level/<name>``; none with
    ``Compression.none`` or ``fp16``)."""
    metrics = {"accordion/bytes": float(state.bytes_sent_last_step),
               "accordion/wire_bytes": float(state.wire_bytes_sent_last_step)}
    if levels:
        metrics.update({f"accordion/level/{name}": float(level) for name, level in state.levels.items()})
    return metrics


class EveryRankState:
    """``state``'s checkpoint for a trainer that writes it from one rank: ``state_dict()`` is, on
    the first rank, every rank's ``state.state_dict()``, in rank order, and ``load_state_dict``
    loads this rank's own entry. Accelerate's ``register_for_checkpointing`` takes it as it is.

    ``state_dict()`` is a collective: call it on every rank, where the trainer dumps its
    checkpoint (Lightning's, Accelerate's ``save_state``: all ranks do, the first writes); it
    gathers to the first rank only.
    ``load_state_dict`` works before the state is bound too: it applies when the state binds.
    At another world size, a rank without an entry takes the first rank's: its shared part
    (levels, Q, the detector) resumes exactly and its own memories restart from zero, with a
    warning."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        """On the group's first rank, which the trainers write from: every rank's state. Elsewhere
        ``None``: no rank holds the others' memories but the one that writes them."""
        # On the CPU: a pickled CUDA tensor would unpickle onto the sender's device.
        mine = map_leaves(self.state.state_dict(), torch.Tensor, lambda tensor: tensor.cpu())
        group = self.state.process_group
        first = dist.get_rank(group) == 0
        gathered = [None] * dist.get_world_size(group) if first else None
        dist.gather_object(mine, gathered, group=group, group_dst=0)
        return gathered

    def load_state_dict(self, saved):
        if saved is None:
            raise ValueError("this checkpoint's Accordion entry is empty: it was written by a rank other than the "
                             "first, which alone gathers every rank's state (Accelerate's save_on_each_node=True "
                             "writes one per node): load the first node's checkpoint")
        rank = dist.get_rank(self.state.process_group)
        mine = saved[rank] if rank < len(saved) else saved[0]
        if mine is not None:  # None: saved before the first step
            self.state.load_state_dict(mine)
