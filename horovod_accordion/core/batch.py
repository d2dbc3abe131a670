"""Accordion for batch size: a small batch in critical regimes, m times larger elsewhere.

The large batch is made of m micro-batches of the small one, accumulated locally and
communicated once (gradient accumulation), so data loaders stay unchanged and the
traffic per sample drops by m. The level Accordion switches is the number of
micro-batches per communication: 1 (ℓ_low, small batch) or m (ℓ_high, large batch).
The decision is whole-model, as in the authors' batch-size runs and Shockwave.
"""

import math
from dataclasses import dataclass

__all__ = ["BatchSwitch", "MicroBatchCounter", "schedule_arguments"]

_LR_SCALING = {
    "linear": lambda multiplier: float(multiplier),
    "sqrt": lambda multiplier: math.sqrt(multiplier),
    "none": lambda multiplier: 1.0,
}


@dataclass(frozen=True)
class BatchSwitch:
    """Switch between ``small_batch`` and ``multiplier``·``small_batch`` samples per rank and step.

    Args:
        small_batch: the per-rank batch of the data loader, used as is in critical regimes.
        multiplier: m; the large batch is m micro-batches, communicated once.
        lr_scaling: how the learning rate follows the batch: ``"linear"`` (Goyal et al.,
            the default), ``"sqrt"``, ``"none"``, or a function of the multiplier in force.
        warmup_steps: after each switch to the large batch, the LR factor ramps linearly
            from 1 to its full value over this many (large-batch) steps.
    """
    small_batch: int
    multiplier: int
    lr_scaling: object = "linear"
    warmup_steps: int = 5

    def __post_init__(self):
        for name in ("small_batch", "multiplier"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BatchSwitch {name} must be a positive integer, got {value!r}")
        if not callable(self.lr_scaling) and self.lr_scaling not in _LR_SCALING:
            raise ValueError(f"lr_scaling must be one of {sorted(_LR_SCALING)} or a function, "
                             f"got {self.lr_scaling!r}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")

    @property
    def levels(self):
        return 1, self.multiplier

    def replace_levels(self, compression_levels):
        """The levels Accordion switches with this batch switch: the micro-batches per step.
        Switching the compression too would confound the two, so it must be fixed."""
        if len(set(compression_levels)) > 1:
            raise ValueError("Accordion switches either the compression level or the batch size: "
                             "with batch_switch, use a fixed compression")
        return self.levels

    def describe(self, levels, size):
        """The batch in force, for each check record."""
        return {"micro_batches_per_step": levels[0], "global_batch": levels[0] * self.small_batch * size}

    def lr_factor(self, micro_batches, steps_since_switch):
        """The factor on the user's learning rate for a step of ``micro_batches`` micro-batches,
        the ``steps_since_switch``-th (from 0) since the batch size last changed."""
        scaling = self.lr_scaling if callable(self.lr_scaling) else _LR_SCALING[self.lr_scaling]
        full = scaling(micro_batches)
        if micro_batches == 1 or steps_since_switch >= self.warmup_steps:
            return full
        return 1 + (full - 1) * (steps_since_switch + 1) / (self.warmup_steps + 1)


class MicroBatchCounter:
    """Groups micro-batches into steps, and gives each step its LR factor.

    The adapters call ``add`` for every micro-batch with the number of micro-batches
    per step now in force; when it returns ``True`` the pending micro-batches are
    communicated and applied, and ``complete_step`` says how many there were and by
    which factor to scale the learning rate for that step.
    """

    def __init__(self, switch):
        self.switch = switch
        self.pending = 0
        # Of the pending micro-batches, those whose gradients this rank does not hold: it
        # restored another rank's checkpoint, which shares the count but not the gradients.
        self.missing = 0
        self._level = None
        self._steps_at_level = 0

    @property
    def held(self):
        """The pending micro-batches whose gradients this rank holds: its sum's divisor."""
        return self.pending - self.missing

    def add(self, micro_batches_per_step):
        self.pending += 1
        return self.pending >= micro_batches_per_step

    def complete_step(self):
        """The record of the step now applied: its micro-batches and LR factor."""
        micro_batches, self.pending, self.missing = self.pending, 0, 0
        same = micro_batches == self._level
        self._steps_at_level = self._steps_at_level + 1 if same else 0
        self._level = micro_batches
        return {"micro_batches": micro_batches,
                "lr_factor": self.switch.lr_factor(micro_batches, self._steps_at_level)}

    def state_dict(self):
        """A large batch in progress: how many of its micro-batches are already accumulated,
        and where the LR warm-up stands."""
        return {"pending": self.pending, "level": self._level, "steps_at_level": self._steps_at_level}

    def load_state_dict(self, state, held=None):
        """``held``: how many of the saved pending micro-batches' gradients this rank restored
        (``None``: all of them)."""
        self.pending, self._level, self._steps_at_level = state["pending"], state["level"], state["steps_at_level"]
        self.hold(self.pending if held is None else held)

    def hold(self, held):
        """This rank holds the gradients of ``held`` of the pending micro-batches (it took another
        rank's count): its large batch is divided by those."""
        self.missing = max(self.pending - held, 0)


def schedule_arguments(batch_switch, compression_levels, reducer, backward_passes_per_step, collectives):
    """What a batch switch sets in an adapter's ``Accordion``, the same on every adapter: the
    levels it switches (the compression's, or the micro-batches per step), the layers whose
    level it reports (the compressed ones, or every layer: one batch size for all, so not per
    layer) and the batch in force in each check record."""
    if batch_switch is None:
        return {"levels": compression_levels, "compressed_layers": reducer.compressed}
    if not isinstance(batch_switch, BatchSwitch):
        raise ValueError(f"batch_switch must be a BatchSwitch, got {batch_switch!r}")
    if backward_passes_per_step != 1:
        raise ValueError("batch_switch accumulates micro-batches itself: leave backward_passes_per_step at 1")
    # describe holds the collectives, not the adapter: an exit warning keeps the Accordion alive.
    return {"levels": batch_switch.replace_levels(compression_levels), "compressed_layers": None,
            "per_layer": False, "describe": lambda levels: batch_switch.describe(levels, int(collectives.size()))}
