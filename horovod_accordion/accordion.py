"""The framework-agnostic driver shared by every adapter.

It owns the detector, counts steps and windows, turns critical flags into levels and
logs each check. Adapters only accumulate gradients, reduce the per-layer squared
norms across ranks and call ``end_window`` with the result.
"""

import math

from horovod_accordion.detector import RegimeDetector
from horovod_accordion.metrics import CommunicationLog

__all__ = ["Accordion"]


class Accordion:
    """Which level each layer uses, and when to re-decide.

    Args:
        layer_names: one name per gradient tensor, in the adapter's order.
        levels: ``(low, high)``: ℓ_low for critical layers, ℓ_high for the others.
        eta, interval, per_layer, lr_decay_factor: see :class:`RegimeDetector`.
        window_steps: a window is this many optimizer steps; ``None`` means the user
            closes each window (an epoch) by calling ``end_epoch()`` on the optimizer.
        log: a :class:`CommunicationLog`.
        describe: a function of the new levels that returns extra fields for each check
            record (the batch variant logs the batch size in force).
    """

    def __init__(self, layer_names, levels, eta=0.5, interval=10, window_steps=None,
                 per_layer=True, lr_decay_factor=2.0, log=None, describe=None):
        if window_steps is not None and (int(window_steps) != window_steps or window_steps < 1):
            raise ValueError(f"window_steps must be a positive integer or None (epochs), got {window_steps!r}")
        self.layer_names = list(layer_names)
        self.low, self.high = levels
        self.window_steps = window_steps
        self.detector = RegimeDetector(len(self.layer_names), eta=eta, interval=interval,
                                       per_layer=per_layer, lr_decay_factor=lr_decay_factor)
        self.log = log if log is not None else CommunicationLog()
        self.describe = describe
        self.step = 0
        self.micro_batches_in_window = 0

    @property
    def adaptive(self):
        return self.low != self.high

    @property
    def levels(self):
        return [self.low if critical else self.high for critical in self.detector.critical]

    def observe_lr(self, lr):
        """Returns ``True`` if a learning-rate decay event just switched every layer to ℓ_low."""
        if not self.detector.observe_lr(lr):
            return False
        self.log.record_decay(self.step, lr, zip(self.layer_names, self.levels))
        return True

    def step_done(self, micro_batches=1):
        """Count one optimizer step. Returns ``True`` when a step-based window is complete."""
        self.step += 1
        self.micro_batches_in_window += micro_batches
        return self.window_steps is not None and self.step % self.window_steps == 0

    @property
    def window_is_check(self):
        """Only a window that ends in a check needs its gradients accumulated and reduced."""
        return self.adaptive and self.detector.next_window_is_check

    def end_window(self, mean_squared_norms=None, **log_extra):
        """Close the window; at a check, with each layer's squared norm of the accumulated
        gradient, averaged over ranks. Norms are divided by the micro-batches in the window,
        so a change in batch size or window length alone does not look like a regime change.
        """
        scale = max(self.micro_batches_in_window, 1)
        self.micro_batches_in_window = 0
        window = self.detector.windows_seen
        if mean_squared_norms is None:
            return self.detector.end_window()
        norms = [math.sqrt(s) / scale if s >= 0 else float("nan") for s in mean_squared_norms]
        if not self.detector.end_window(norms):
            return False
        ratios = self.detector.last_ratios
        if not self.detector.per_layer:
            ratios = ratios * len(self.layer_names)
        self.log.record_check(
            self.step, window, zip(self.layer_names, self.levels),
            zip(self.layer_names, ratios), zip(self.layer_names, norms),
            **log_extra, **(self.describe(self.levels) if self.describe else {}))
        return True

    def close_window(self, reducer, ops, accumulated):
        """Close a window for an adapter: at a check, average each layer's squared norm of
        its ``accumulated`` gradient over ranks (one small allreduce through ``ops``),
        decide, and give ``reducer`` the new levels; then empty the accumulators."""
        if self.window_is_check:
            mean_squared = ops.allreduce_flat_mean(ops.squared_norms(accumulated), "accordion.norms")
            if self.end_window(ops.to_floats(mean_squared), bytes_sent=ops.take_bytes_sent()):
                reducer.set_levels(self.levels)
        else:
            self.end_window()
        for total in accumulated:
            ops.zero(total)

    def state_dict(self):
        return {"detector": self.detector.state_dict(), "step": self.step,
                "micro_batches_in_window": self.micro_batches_in_window,
                "levels": (self.low, self.high), "layer_names": self.layer_names}

    def load_state_dict(self, state):
        if tuple(state["levels"]) != (self.low, self.high):
            raise ValueError(f"checkpoint levels {tuple(state['levels'])} differ from this optimizer's "
                             f"{(self.low, self.high)}")
        if list(state["layer_names"]) != self.layer_names:
            raise ValueError("checkpoint layer names differ from this model's parameters")
        self.detector.load_state_dict(state["detector"])
        self.step = state["step"]
        self.micro_batches_in_window = state["micro_batches_in_window"]
