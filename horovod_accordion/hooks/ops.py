"""The torch.distributed collectives of ``horovod_accordion.core.reducers``, for DDP's communication
hook: asynchronous ``torch.distributed`` collectives over the shared torch tensor maths.

Unlike Horovod's, these collectives are matched across ranks by the order in which they
are issued, not by name: every rank issues them from the same thread (the autograd
thread that calls the hook, or the main thread at a window's end), in the same order.
"""

import atexit
import time

import torch
import torch.distributed as dist

from horovod_accordion.core.collectives import Collectives
from horovod_accordion.torch_common.compression import NoneCompressor

__all__ = ["DistributedCollectives"]


# Gloo's worker thread lets go of a finished collective's tensors just after it completes, and
# freeing a tensor that Python made takes the GIL. A worker that gets there after the interpreter
# has begun to finalize is ended inside a destructor, and the process aborts ("terminate called
# without an active exception", pytorch/pytorch#38228, #190489), after training has finished, with
# Accordion's hook and with plain DDP alike. So at exit, while the interpreter is whole, the GIL
# is handed over long enough for the workers to finish: registered on import, so that a baseline
# run without the hook has it too.
atexit.register(time.sleep, 0.1)


class _Pending:
    """A started collective, and what its ``wait()`` returns once it is done."""

    def __init__(self, work, result):
        self.work, self.result = work, result

    def wait(self):
        self.work.wait()
        return self.result()


class DistributedCollectives(Collectives):
    """torch.distributed matches collectives by the order they are issued, not by name."""

    def __init__(self, tensors, process_group=None):
        super().__init__(tensors)
        self.process_group = process_group

    def size(self):
        return dist.get_world_size(self.process_group)

    def rank(self):
        return dist.get_rank(self.process_group)

    def start_allreduce_mean(self, flat, name, compression=None):
        """Sum in place and divide: Gloo has no average. ``flat`` is ours to overwrite
        (``flat_concat``). An fp16 wire (``Compression.fp16``, or fp16 gradients) is divided
        before the sum, as torch's ``fp16_compress_hook`` and DDP's own allreduce do, so that
        fp16 sums of many ranks do not overflow; an fp32 or fp64 one after it."""
        compression = compression or NoneCompressor
        wire, ctx = compression.compress(flat)
        divide_first = wire.dtype == torch.float16
        if divide_first:
            wire.div_(self.size())
        self.count("allreduce", wire.numel() * wire.element_size())
        work = dist.all_reduce(wire, group=self.process_group, async_op=True)
        return _Pending(work, lambda: compression.decompress(wire if divide_first else wire.div_(self.size()), ctx))

    def _start_allgather(self, flat, name):
        """Every rank's 1-D ``flat``, as shape (size, len); Gloo gathers into a list."""
        self.count("allgather", flat.numel() * flat.element_size())
        gathered = [torch.empty_like(flat) for _ in range(self.size())]
        work = dist.all_gather(gathered, flat, group=self.process_group, async_op=True)
        return _Pending(work, lambda: torch.stack(gathered))

    def _start_alltoall(self, rows, name):
        """Row j of ``rows`` (one per rank) to rank j; ``wait()`` gives the rows received, row r
        from rank r."""
        self.count("alltoall", rows.numel() * rows.element_size())
        received = torch.empty_like(rows)
        work = dist.all_to_all_single(received, rows.contiguous(), group=self.process_group, async_op=True)
        return _Pending(work, lambda: received)

    # The cross-rank checks, blocking.
    def broadcast_object(self, value):
        """The first rank of the process group's ``value``, on every rank."""
        holder = [value]
        root = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
        dist.broadcast_object_list(holder, src=root, group=self.process_group)
        return holder[0]

    def sum_over_ranks(self, count):
        total = torch.tensor([count], dtype=torch.int64, device=self.tensors.device)
        dist.all_reduce(total, group=self.process_group)
        return int(total.item())
