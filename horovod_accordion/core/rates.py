"""The learning rate the decay rule reads, agreed over the ranks without a collective of its own.

Ranks whose rates differ (a ``ReduceLROnPlateau`` stepped on each rank's own loss) would switch
levels apart, and their collectives would no longer match: a Horovod error, a hang under NCCL.
So each rank's rate rides on a collective that the step makes anyway (``Collectives.carry``),
the first of bucket 0's first phase that can carry it, as its 64 IEEE bits, one 0/1 value each,
after a marker that is 1 once the rank has observed a rate:

- an all-gather or an all-to-all (the quantized shots) hands every rank every rank's values
  unchanged, in any dtype;
- an allreduce (PowerSGD's P, TopK's dense part, a dense bucket) averages them, in fp32 or fp64
  only: the sum of 0/1 values over W ranks is an integer, each bit's count c = round(mean × W)
  is exact while the rounding of the mean stays under 1/(2W) (``exact_average``), and c is 0 or
  W on every bit exactly when every rank sent the same rate. fp16 and bf16 wires carry nothing.

The step's averages are not held back for it: the mean arrives with the carrier, and the
schedule reads it before the next step's first bucket, so a decay switches levels one step
after the rate dropped. Every rank reads the same means, so every rank decides alike, and where
the rates differ every rank raises, with each rank's rate, gathered for the message. Where
bucket 0 has no collective that can carry the rate (a bf16 wire, every layer dense in bf16),
it is averaged on its own after that bucket. Imports no framework.
"""

import numpy as np

__all__ = ["CARRYING_BUCKET", "RATE_VALUES", "RateAgreement", "exact_average", "rate_values", "rates_of"]

RATE_VALUES = 65  # the marker, then the rate's 64 bits
CARRYING_BUCKET = 0  # the bucket whose collectives carry the rate: every adapter has a bucket 0


def rate_values(rate):
    """The values a rank sends for ``rate``: 1 (a rate was observed), then its 64 bits, low first."""
    bits = np.unpackbits(np.array([rate], dtype="<f8").view(np.uint8), bitorder="little")
    return [1.0] + bits.astype(float).tolist()


def _rate_of(bits):
    """The rate whose 64 bits, low first, are ``bits`` (truthy or not)."""
    return float(np.packbits(np.asarray(bits, dtype=bool), bitorder="little").view("<f8")[0])


def rates_of(rows):
    """Each rank's rate (``None`` where it observed none) from the values each rank sent."""
    return [_rate_of(np.rint(row[1:])) if round(row[0]) else None for row in rows]


def _agreed(means, size):
    """From the means over ``size`` ranks of the values they sent: the rate they all sent,
    ``None`` where none observed one, ``False`` where they differ."""
    counts = np.rint(np.asarray(means) * size)
    if not np.all((counts == 0) | (counts == size)):
        return False
    return _rate_of(counts[1:]) if counts[0] else None


def exact_average(wire_dtype, size):
    """Whether an allreduce of ``wire_dtype`` over ``size`` ranks averages 0/1 values into means
    whose counts round(mean × W) are exact. The sum of the W values (each pre-scaled at most once,
    Horovod's ``gradient_predivide_factor``) and its scaling round at most W + 2 times, each by
    at most u (2⁻²⁴ in fp32, 2⁻⁵³ in fp64) relative, so |mean × W − c| ≤ (W + 2)·u·W: under 1/2
    when W·(W + 2) < 1/(2u), up to W = 2895 in fp32. ``size=None`` (not known when the step is
    traced): fp64 only, exact up to 2²⁶ ranks."""
    unit = {"float32": 2.0 ** -24, "float64": 2.0 ** -53}.get(wire_dtype)
    if size is None:
        return wire_dtype == "float64"
    return unit is not None and size * (size + 2) < 1 / (2 * unit)


class RateAgreement:
    """Args:
        tensors: the backend's tensor maths.
        collectives: the collectives that carry this rank's rate, and that gather the rates for
            the message where they differ.

    ``observe(lr)`` before each step's first bucket; ``carry(start)`` around the start of the
    step's bucket 0 (``CARRYING_BUCKET``): a bucket every rank starts in every step, whatever
    order the gradients come in, so every rank carries the rate on the same collective (Horovod
    matches them by name); ``collectives_done()`` after that bucket's collectives; ``agreed()``:
    the rate the last step carried, the same on every rank, or ``None``. A traced step (TF)
    carries at each tracing: no state carries over from one tracing to the next.
    """

    def __init__(self, tensors, collectives):
        self.tensors, self.collectives = tensors, collectives
        self.sent = tensors.host_state(np.zeros(RATE_VALUES), "accordion_rate_sent")
        self.means = tensors.host_state(np.zeros(RATE_VALUES), "accordion_rate_means")
        self.observed = None  # the rate ``sent`` holds
        self.unsent = False  # the carrying bucket had no collective that could carry the rate

    def observe(self, lr):
        """This rank's rate, which the next steps carry until another is observed."""
        lr = float(lr)  # a tensor rate (a capturable optimizer's) is read here
        if lr != self.observed:
            self.tensors.set_host_state(self.sent, rate_values(lr))
            self.observed = lr

    def carry(self, start):
        """Run ``start()``, the start of the carrying bucket: the first collective of its first
        phase that can carry the rate does; where none can, ``collectives_done`` averages it."""
        self.collectives.carry(self.sent, self.means)
        try:
            return start()
        finally:
            self.unsent = self.collectives.riding()
            self.collectives.drop_rider()

    def collectives_done(self):
        """After the carrying bucket's collectives: where none could carry the rate, average it now."""
        if self.unsent:
            self.unsent = False
            mean = self.collectives.allreduce_means([self.tensors.values_like(self.sent)], "lr")[0]
            self.tensors.hold_for_host(self.means, mean)

    def check_over(self, world):
        """At a check under hybrid sharding: the rate was agreed among each shard's replicas; the
        ranks of one replica, which exchange nothing of ours between checks, are compared here,
        over the ``world``, and all raise where they differ."""
        means = self.tensors.to_floats(world.allreduce_means([self.tensors.values_like(self.sent)], "lr_world")[0])
        if _agreed(means, int(world.size())) is False:
            self._raise_rates_differ(world)

    def abandon_step(self):
        """A step failed or state was restored: whatever its collectives carried is dropped, on
        every rank alike (a worker that joins has carried nothing)."""
        self.collectives.drop_rider()
        self.unsent = False
        self.tensors.set_host_state(self.means, [0.0] * RATE_VALUES)

    def agreed(self):
        """The rate the last carried step agreed on, once (then ``None`` until a step carries
        another); ``None`` where no rank observed one. Raises on every rank where they differ."""
        means = self.tensors.read_host_state(self.means)
        if not means[0]:
            return None
        self.tensors.set_host_state(self.means, [0.0] * RATE_VALUES)
        agreed = _agreed(means, int(self.collectives.size()))
        if agreed is False:
            self._raise_rates_differ(self.collectives)
        return agreed

    def _raise_rates_differ(self, collectives):
        tensors = self.tensors
        rows = tensors.to_floats(collectives.start_allgather(tensors.values_like(self.sent), "lr_differ").wait())
        collectives.take_traffic()  # the message's, not a step's traffic
        rates = {rank: rate for rank, rate in enumerate(rates_of(rows))}
        raise RuntimeError(
            f"the ranks' learning rates differ (rank: rate, None where none was observed): {rates}. The decay rule "
            f"would switch their levels apart, and their collectives would no longer match. Give every rank the same "
            f"rate: average the metric a scheduler reads over ranks (hvd.allreduce, Keras' MetricAverageCallback), as "
            f"Horovod advises, or pass lr_decay_factor=None to turn the rule off")
