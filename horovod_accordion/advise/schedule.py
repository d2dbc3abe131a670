"""One training step as our exchange schedules it, from measured times and exact bytes.

The compute thread runs forward, then backward. When a bucket's last gradient is ready,
its hook runs the bucket's first segment inline (the reducer's maths up to its first
collective: PowerSGD's P, TopK's selection, a quantization, a cast), which delays the rest of
backward, and issues that segment's collectives. After backward, ``BucketReduction.finish``
advances the started buckets round-robin: each segment waits for the bucket's previous
collectives, then computes (orthogonalise P and form Q, average and quantize again, or
decompress) and issues the next ones; PowerSGD's Q thus waits for its P, Quantized's
all-gather for its all-to-all. Everything finishes before the optimizer step.

The wire is one link, taking collectives one at a time in the order they are issued (Gloo's
and Horovod's background threads do). A ``fusable`` collective (Horovod's dense allreduce of
one gradient) joins the previous fusable one while that is still queued, as Horovod's tensor
fusion batches whatever is ready: one latency for the batch.
"""

from dataclasses import dataclass, field

from horovod_accordion.advise.wire import collective_seconds

__all__ = ["Bucket", "Segment", "Step", "step_seconds"]


@dataclass
class Segment:
    """``compute_s`` of maths on the compute thread, then ``collectives``: a list of
    ``(kind, bytes_per_rank)``, kind ``"allreduce"``, ``"allgather"`` or ``"alltoall"``."""
    compute_s: float
    collectives: list = field(default_factory=list)


@dataclass
class Bucket:
    """A bucket whose gradients are all ready ``ready_s`` after backward starts."""
    ready_s: float
    segments: list
    fusable: bool = False


@dataclass
class Step:
    forward_s: float
    backward_s: float
    buckets: list
    optimizer_s: float
    extra_s: float = 0.0  # after the exchange, before the optimizer step (Accordion's check)


class _Wire:
    def __init__(self, workers, link, algorithm):
        self.workers, self.link, self.algorithm = workers, link, algorithm
        self.free_at = 0.0
        self.last = None  # the latest transfer, which a fusable one may join while it is queued

    def send(self, issued_at, kind, size, fusable):
        last = self.last
        if fusable and last is not None and last.fusable and last.kind == kind and last.start > issued_at:
            last.size += size
        else:
            last = _Transfer(kind, size, max(self.free_at, issued_at), fusable)
            self.last = last
        last.end = last.start + collective_seconds(kind, last.size, self.workers, self.link, self.algorithm)
        self.free_at = last.end
        return last


@dataclass
class _Transfer:
    kind: str
    size: int
    start: float
    fusable: bool
    end: float = 0.0


def step_seconds(step, workers, link, algorithm="ring"):
    """The predicted duration of ``step`` on ``workers`` ranks joined by ``link``."""
    wire = _Wire(workers, link, algorithm)
    clock, delay = 0.0, 0.0
    in_flight = {}  # bucket index -> its collectives of the segment last run
    backward_starts = step.forward_s
    order = sorted(range(len(step.buckets)), key=lambda b: step.buckets[b].ready_s)
    for b in order:
        bucket = step.buckets[b]
        clock = max(clock, backward_starts + bucket.ready_s + delay)
        first = bucket.segments[0]
        clock += first.compute_s
        delay += first.compute_s
        in_flight[b] = [wire.send(clock, kind, size, bucket.fusable) for kind, size in first.collectives]
    clock = max(clock, backward_starts + step.backward_s + delay)
    running = {b: 1 for b in order if len(step.buckets[b].segments) > 1}
    while running:
        for b in list(running):
            segment = step.buckets[b].segments[running[b]]
            clock = max([clock] + [transfer.end for transfer in in_flight[b]]) + segment.compute_s
            in_flight[b] = [wire.send(clock, kind, size, step.buckets[b].fusable) for kind, size in segment.collectives]
            running[b] += 1
            if running[b] == len(step.buckets[b].segments):
                del running[b]
    return max(clock, wire.free_at) + step.extra_s + step.optimizer_s
