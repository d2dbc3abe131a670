"""The collectives that the reducers and the exchange call, over a backend's tensor maths.

Each backend supplies the collectives of one flat tensor (``start_allreduce_mean``,
``start_allgather``) and the world's ``size`` and ``rank``: Horovod's torch ops
(``torch/ops.py``), torch.distributed for DDP (``hooks/ops.py``) and Horovod's TF ops
(``tensorflow/ops.py``). Fusing a list of tensors into one allreduce per wire dtype, as torch's
``powerSGD_hook`` buckets them, is written here once. Imports no framework.
"""

from typing import NamedTuple

__all__ = ["Collectives", "Done", "Traffic", "wire_share"]


class Traffic(NamedTuple):
    """What one rank sent: the bytes it handed to collectives, and those that crossed its link."""
    handed: int = 0
    wire: int = 0

    def __add__(self, other):
        return Traffic(self.handed + other.handed, self.wire + other.wire)


def wire_share(collective, size):
    """How many times its buffer a collective carries over each rank's link, on ``size`` ranks:
    a ring allreduce sends 2(W − 1)/W of it, an all-gather the W − 1 other ranks' buffers (each
    rank hands over its own), an all-to-all the (W − 1)/W of it that is for other ranks. ``size``
    may be a framework's number (a traced TF step's)."""
    if collective == "allreduce":
        return 2 * (size - 1) / size
    if collective == "allgather":
        return size - 1
    if collective == "alltoall":
        return (size - 1) / size
    raise ValueError(f"a collective is 'allreduce', 'allgather' or 'alltoall', got {collective!r}")


class Collectives:
    """Args:
        tensors: the backend's tensor maths, whose flat buffers the collectives send.

    A backend adds ``size()``, ``rank()``, ``start_allreduce_mean(flat, name, compression)``,
    ``start_allgather(flat, name)`` and ``start_alltoall(rows, name)``; each started
    collective's ``wait()`` gives its result, and each ``count``s what it hands over: the bytes
    this rank hands to the collective (``bytes_sent``) and those that cross its link
    (``wire_bytes_sent``). ``flat`` is the collective's to overwrite: averaging it in place
    spares the split of a packed buffer (``pack_products``).
    """

    name_prefix = None  # Horovod matches collectives by name (``arguments.collective_prefix``)

    def __init__(self, tensors):
        self.tensors = tensors
        self.bytes_sent = 0
        self.wire_bytes_sent = 0

    def count(self, collective, handed):
        """Count a collective (``wire_share``'s names) to which this rank hands ``handed`` bytes."""
        self.bytes_sent += handed
        self.wire_bytes_sent += wire_share(collective, int(self.size())) * handed

    def start_allreduce_means(self, tensors, name, compression=None):
        """Start averaging each of ``tensors`` over ranks with one allreduce per wire dtype,
        instead of one call per layer. Returns the pending result: its ``wait()`` gives the
        averages, in order."""
        groups = {}
        for i, tensor in enumerate(tensors):
            groups.setdefault(self.tensors.wire_dtype(tensor), []).append(i)
        started = [(indices, self.start_allreduce_mean(
                        self.tensors.flat_concat([tensors[i] for i in indices], wire_dtype), f"{name}.{wire_dtype}",
                        compression))
                   for wire_dtype, indices in groups.items()]
        return _FusedAverage(self.tensors, tensors, started)

    def allreduce_means(self, tensors, name, compression=None):
        return self.start_allreduce_means(tensors, name, compression).wait()

    def included(self):
        """Whether this process takes part in the collectives: a Horovod process set may leave it out."""
        return True

    def agree_max(self, value, name):
        """The largest ``value`` over ranks, by the backend's allgather, which may be a device's:
        the real backends agree on the host instead."""
        counted = self.bytes_sent, self.wire_bytes_sent
        gathered = self.start_allgather(self.tensors.from_floats([value]), name).wait()
        self.bytes_sent, self.wire_bytes_sent = counted
        return max(self.tensors.to_floats(gathered.reshape(-1)))

    def take_traffic(self):
        """The ``Traffic`` since the last call."""
        traffic = Traffic(self.bytes_sent, round(self.wire_bytes_sent))
        self.bytes_sent, self.wire_bytes_sent = 0, 0
        return traffic


class Done:
    """A collective whose result is there as soon as it is started: a TF graph op (TF runs it
    when its inputs are ready), or the advisor's simulated world."""

    def __init__(self, output):
        self.output = output

    def wait(self):
        return self.output


class _FusedAverage:
    def __init__(self, tensors, inputs, started):
        self.tensors, self.inputs, self.started = tensors, inputs, started

    def wait(self):
        outputs = [None] * len(self.inputs)
        for indices, pending in self.started:
            members = [self.inputs[i] for i in indices]
            for i, value in zip(indices, self.tensors.split_like(pending.wait(), members)):
                outputs[i] = value
        return outputs
