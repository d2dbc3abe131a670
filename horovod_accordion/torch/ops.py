"""The Horovod collectives of ``horovod_accordion.core.reducers`` for torch: Horovod's asynchronous
collectives over the shared torch tensor maths (``horovod_accordion.torch_common.tensors``).
"""

import time

import torch
import horovod.torch as hvd

from horovod_accordion.core.process_sets import HorovodProcessSetCollectives
from horovod_accordion.torch.compression import NoneCompressor

__all__ = ["TorchCollectives"]

# Horovod's synchronize() spins until its collective completes, holding the GIL. Where ranks
# share the cores, as in CPU training, the spin takes the core from the background thread doing
# the reduction and from the other ranks' compute. Polling with a short back-off leaves the core
# free, at the cost of up to about the longest pause plus the kernel's timer slack per wait. On a
# GPU the node has cores to spare and the wait stays Horovod's own.
_FIRST_PAUSE_S, _LONGEST_PAUSE_S = 1e-5, 2e-4


def _wait_for(handle, polling):
    """``hvd.synchronize(handle)``; with ``polling``, without spinning a core meanwhile. A sparse
    allreduce's handle is a function that waits and returns the aggregate."""
    if callable(handle):
        return handle()
    pause = _FIRST_PAUSE_S
    try:
        while polling and not hvd.poll(handle):
            time.sleep(pause)
            pause = min(2 * pause, _LONGEST_PAUSE_S)
    except ValueError:  # a handle Horovod no longer holds: synchronize() answers as it always has
        pass
    return hvd.synchronize(handle)


class _Pending:
    """A started Horovod collective and what to do with its output."""

    def __init__(self, handle, finish, on_cpu):
        self.handle, self.finish, self.on_cpu = handle, finish, on_cpu

    def wait(self):
        return self.finish(_wait_for(self.handle, polling=self.on_cpu))


class TorchCollectives(HorovodProcessSetCollectives):
    horovod_module = hvd
    as_tensor = staticmethod(torch.tensor)

    # Collectives: one fused call per phase; each counts the bytes this rank contributes.
    def start_allreduce_mean(self, flat, name, compression=None):
        """Start Horovod's asynchronous allreduce; the result's ``wait()`` gives the average."""
        compression = compression or NoneCompressor
        wire, ctx = compression.compress(flat)
        self.count("allreduce", wire.numel() * wire.element_size())
        # Pre/post-scaling splits the average, as Horovod's optimizer does, so that fp16
        # sums of many workers do not overflow (horovod#1699).
        # In place, as Horovod's optimizer does: ``flat`` is ours to overwrite (``flat_concat``).
        handle = hvd.allreduce_async_(wire, name=f"{self.name_prefix}.{name}", op=hvd.Average,
                                      prescale_factor=1.0 / self.gradient_predivide_factor,
                                      postscale_factor=self.gradient_predivide_factor, process_set=self.process_set)
        return _Pending(handle, lambda reduced: compression.decompress(reduced, ctx), wire.device.type == "cpu")

    def _start_allgather(self, flat, name):
        """Start gathering every rank's 1-D ``flat``; ``wait()`` gives them as shape (size, len)."""
        self.count("allgather", flat.numel() * flat.element_size())
        handle = hvd.allgather_async(flat, name=f"{self.name_prefix}.{name}", process_set=self.process_set)
        return _Pending(handle, lambda gathered: gathered.view(self.size(), -1), flat.device.type == "cpu")

    def _start_alltoall(self, rows, name):
        """Start sending row j of ``rows`` (one per rank) to rank j; ``wait()`` gives the rows
        received, row r from rank r."""
        self.count("alltoall", rows.numel() * rows.element_size())
        handle = hvd.alltoall_async(rows, name=f"{self.name_prefix}.{name}", process_set=self.process_set)
        return _Pending(handle, lambda received: received[0].view(rows.shape), rows.device.type == "cpu")

    def start_sparse_allreduce(self, grad, name, op):
        """Horovod's sparse allreduce of a sparse gradient (an allgather of its indices and values),
        as Horovod's optimizer makes it for ``sparse_as_dense=False``; ``wait()`` gives the
        aggregate, sparse, averaged or summed by ``op``."""
        grad = grad.coalesce()
        self.count("allgather", sum(t.numel() * t.element_size() for t in (grad.indices(), grad.values())))
        return _Pending(hvd.sparse_allreduce_async(grad, name=f"{self.name_prefix}.{name}", op=op,
                                                   process_set=self.process_set), lambda aggregate: aggregate, False)
