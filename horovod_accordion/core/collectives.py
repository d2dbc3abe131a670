"""The collectives that the reducers and the exchange call, over a backend's tensor maths.

Each backend supplies the collectives of one flat tensor (``start_allreduce_mean``,
``start_allgather``) and the world's ``size`` and ``rank``: Horovod's torch ops
(``torch/ops.py``), torch.distributed for DDP (``hooks/ops.py``) and Horovod's TF ops
(``tensorflow/ops.py``). Fusing a list of tensors into one allreduce per wire dtype, as torch's
``powerSGD_hook`` buckets them, is written here once. Imports no framework.
"""

from typing import NamedTuple

from horovod_accordion.core.rates import RATE_VALUES, exact_average

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
    ``_start_allgather(flat, name)`` and ``_start_alltoall(rows, name)``; each started
    collective's ``wait()`` gives its result, and each ``count``s what it hands over: the bytes
    this rank hands to the collective (``bytes_sent``) and those that cross its link
    (``wire_bytes_sent``). ``flat`` is the collective's to overwrite: averaging it in place
    spares the split of a packed buffer (``pack_products``).

    The public ``start_allreduce_means``, ``start_allgather`` and ``start_alltoall`` carry a
    rider (``carry``): a few values that ride on the first of them that can carry them exactly,
    in the leading columns of its buffer, and whose mean over ranks is held for the host
    (``horovod_accordion.core.rates``).
    """

    name_prefix = None  # Horovod matches collectives by name (``arguments.collective_prefix``)

    def __init__(self, tensors):
        self.tensors = tensors
        self.bytes_sent = 0
        self.wire_bytes_sent = 0
        self._rider = None  # (values, means): a host state to send, one to hold their mean over ranks

    def carry(self, values, means):
        """Send the host state ``values`` (0/1 floats) on the next collective that can carry them
        exactly, and hold their mean over ranks in the host state ``means`` (``hold_for_host``)."""
        self._rider = (values, means)

    def riding(self):
        """Whether a rider waits for a collective that can carry it."""
        return self._rider is not None

    def drop_rider(self):
        """Carry nothing more: the rider is for the collectives started since ``carry``."""
        self._rider = None

    def _take_rider(self):
        rider, self._rider = self._rider, None
        return rider

    def count(self, collective, handed):
        """Count a collective (``wire_share``'s names) to which this rank hands ``handed`` bytes."""
        self.bytes_sent += handed
        self.wire_bytes_sent += wire_share(collective, int(self.size())) * handed

    def start_allreduce_means(self, tensors, name, compression=None):
        """Start averaging each of ``tensors`` over ranks with one allreduce per wire dtype,
        instead of one call per layer. Returns the pending result: its ``wait()`` gives the
        averages, in order. Carries the rider where one of ``tensors`` is averaged exactly enough
        (``rates.exact_average``) and nothing compresses it: as one more member of its allreduce."""
        carrier = self._carrier(tensors, compression) if self._rider is not None else None
        if carrier is None:
            return self._start_allreduce_means(tensors, name, compression)
        values, means = self._take_rider()
        pending = self._start_allreduce_means([*tensors, self.tensors.values_like(values, carrier)], name)
        return _Carrying(pending, lambda averages: self._arrived(means, averages[-1], averages[:-1]))

    def _carrier(self, tensors, compression):
        """The first of ``tensors`` whose wire averages the rider exactly, or ``None``. A
        compression (``Compression.fp16``, a cast) changes the wire: then none."""
        if compression is not None:
            return None
        size = self.size()  # a traced TF step's under hvd.elastic: then only fp64 is exact for sure
        size = size if isinstance(size, int) else None
        return next((t for t in tensors if exact_average(self.tensors.wire_dtype(t), size)), None)

    def start_allgather(self, flat, name):
        """Start gathering every rank's 1-D ``flat``: ``wait()`` gives them as shape (size, len).
        Carries the rider in the leading columns."""
        if self._rider is None:
            return self._start_allgather(flat, name)
        tensors, (values, means) = self.tensors, self._take_rider()
        flat = tensors.reshape(tensors.with_leading_columns(tensors.reshape(flat, (1, -1)), values), (-1,))
        return _Carrying(self._start_allgather(flat, name), lambda rows: self._arrived_in_columns(means, rows))

    def start_alltoall(self, rows, name):
        """Start sending row j of ``rows`` (shape (size, k)) to rank j: ``wait()`` gives the rows
        received, row r from rank r. Carries the rider in the leading columns of every row."""
        if self._rider is None:
            return self._start_alltoall(rows, name)
        tensors, (values, means) = self.tensors, self._take_rider()
        pending = self._start_alltoall(tensors.with_leading_columns(rows, values), name)
        return _Carrying(pending, lambda received: self._arrived_in_columns(means, received))

    def _arrived_in_columns(self, means, rows):
        tensors, width = self.tensors, RATE_VALUES
        return self._arrived(means, tensors.column_means(tensors.columns(rows, 0, width)),
                             tensors.columns(rows, width, None))

    def _arrived(self, means, mean, result):
        self.tensors.hold_for_host(means, mean)
        return result

    def _start_allreduce_means(self, tensors, name, compression=None):
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


class _Carrying:
    """A started collective that carries a rider: ``wait()`` holds the rider's mean and gives the
    collective's own result."""

    def __init__(self, pending, arrived):
        self.pending, self.arrived = pending, arrived

    def wait(self):
        return self.arrived(self.pending.wait())


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
