"""``broadcast_optimizer_state``: Horovod's, for Accordion's optimizer too.

The wrapped optimizer's state and the schedule's travel from the root; each rank keeps what is
its own by nature (error feedback, TopK residuals, the window's Δ).
"""
import torch
import horovod.torch as hvd

from horovod_accordion.core.arguments import under_elastic
from horovod_accordion.torch.optimizer import AccordionOptimizer
from horovod_accordion.torch_common.tensors import map_leaves

__all__ = ["broadcast_optimizer_state"]


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """``hvd.broadcast_optimizer_state`` for Accordion's optimizer, and Horovod's for any other.

    Every rank takes ``root_rank``'s state: the wrapped optimizer's (momentum, LR), the
    levels, the detector, Q and the step counters. Each rank keeps its own error-feedback
    memory, TopK residuals and window Δ, which are per rank by nature. An optimizer with no
    state yet gets one as Horovod gives it (zero gradients and the wrapped optimizer's own
    step), without a step of the exchange: no phantom update of the compression state. It
    makes one broadcast whatever each rank has loaded, so "rank 0 loads the checkpoint, then
    broadcast" cannot hang.
    """
    if not isinstance(optimizer, AccordionOptimizer):
        return hvd.broadcast_optimizer_state(optimizer, root_rank, model=model)
    process_set = optimizer.process_set
    if not process_set.included():
        return None
    if under_elastic():
        optimizer.check_same_parameters_on_all_ranks()
    if not super(optimizer.__class__, optimizer).state_dict()["state"]:
        _initialize_state(optimizer)
    shared = None
    if hvd.rank() == root_rank:
        shared = optimizer.state_dict()
        shared["accordion"] = dict(shared["accordion"], per_rank=None)
    shared = _broadcast_state(shared, root_rank, process_set, optimizer._tensors.device)
    own = optimizer.state_dict()["accordion"]["per_rank"]
    shared["accordion"]["per_rank"] = own
    optimizer.load_state_dict(shared)
    return None


def _initialize_state(optimizer):
    """Horovod's way to give a fresh optimizer its state (momentum buffers, Adam's moments) before
    a broadcast: zero gradients and one step of the wrapped optimizer. Without the exchange, so
    nothing is communicated and no Accordion step is counted; the zero gradients stay, as
    Horovod leaves them. Unlike Horovod's, the parameters are put back as they were: with weight
    decay that step moves them, on the ranks whose state was empty only ("rank 0 loads the
    checkpoint"), and the replicas would part."""
    trained = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    kept = [p.detach().clone() for p in trained]
    for p in trained:
        p.grad = torch.zeros_like(p)
        if isinstance(optimizer, torch.optim.SparseAdam):
            p.grad = p.grad.to_sparse()
    super(optimizer.__class__, optimizer).step()
    with torch.no_grad():
        for p, value in zip(trained, kept):
            p.copy_(value)


class _TensorSlot:
    """Where a broadcast state had a tensor: its shape, dtype and whether it lived on the CPU
    (Adam keeps its step count there, to avoid a host sync per parameter)."""

    def __init__(self, tensor):
        self.shape, self.dtype, self.on_cpu = tuple(tensor.shape), tensor.dtype, tensor.device.type == "cpu"


def _broadcast_state(state, root_rank, process_set, device):
    """``root_rank``'s ``state`` on every rank. Its tensors travel as tensors, as in Horovod's
    ``broadcast_optimizer_state``, each landing on this rank's ``device`` (or on the CPU, where
    the root kept it there); only the rest is pickled, so no rank unpickles a tensor onto the
    root's GPU."""
    root = hvd.rank() == root_rank
    sent = []

    def to_slot(tensor):
        sent.append(tensor)
        return _TensorSlot(tensor)

    skeleton = hvd.broadcast_object(map_leaves(state, torch.Tensor, to_slot) if root else None,
                                    root_rank=root_rank, name="accordion.optimizer_state", process_set=process_set)
    buffers = []

    def to_buffer(slot):
        """Every rank walks the skeleton in the same order, so the k-th buffer is the root's k-th tensor."""
        where = "cpu" if slot.on_cpu else device
        if root:  # a copy: state_dict() hands out the live tensors
            buffers.append(sent[len(buffers)].to(where, copy=True).contiguous())
        else:
            buffers.append(torch.empty(slot.shape, dtype=slot.dtype, device=where))
        return buffers[-1]

    received = map_leaves(skeleton, _TensorSlot, to_buffer)
    handles = [hvd.broadcast_async_(tensor, root_rank, name=f"accordion.optimizer_state.{k}", process_set=process_set)
               for k, tensor in enumerate(buffers)]
    for handle in handles:
        hvd.synchronize(handle)
    return received
