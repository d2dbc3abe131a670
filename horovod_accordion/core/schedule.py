"""The schedule shared by every adapter: no tensors, no collectives.

It owns the detector, counts steps and windows, turns critical flags into levels through
the policy and logs each check. The exchange (``horovod_accordion.core.exchange``) accumulates
the gradients, reduces the per-layer squared norms across ranks and calls ``end_window``
with the result.
"""

import math
import os
import warnings
import weakref

from horovod_accordion.core.detector import RegimeDetector
from horovod_accordion.core.metrics import CommunicationLog
from horovod_accordion.core.policies import make_policy, policy_for

__all__ = ["Accordion", "NO_WINDOW_WARNING_STEPS", "warn_at_exit_if_no_window_closed", "warn_if_no_window_closed"]

# Longer than any epoch of a data-parallel job (ImageNet-1k on 8 ranks of 32 is 5,000 steps):
# with no window closed by then, nothing calls end_epoch().
NO_WINDOW_WARNING_STEPS = 50_000


class Accordion:
    """Which level each layer uses, and when to re-decide.

    Args:
        layer_names: one name per gradient tensor, in the adapter's order.
        levels: the ladder ``(low, ..., high)``: ℓ_low for critical layers, ℓ_high for the
            others, and the levels between for a policy that uses them.
        eta, interval, per_layer, lr_decay_factor: see ``RegimeDetector``.
        window_steps: a window is this many optimizer steps; ``None`` means the user
            closes each window (an epoch) by calling ``end_epoch()`` on the optimizer.
        delta_windows: the accumulated gradient Δ of a check spans this many windows
            ending at the check (1 ≤ delta_windows ≤ interval). The authors' 1 compares one
            epoch with one epoch; a longer Δ averages out the noise of small windows.
        check_norm: ``"local"`` (the default): the mean over ranks of each rank's squared
            norm of its own Δ, one scalar per layer on the wire. ``"averaged"``: the norm of
            the Δ averaged over ranks, which is the norm of the gradient the model actually
            followed, for one dense allreduce of the model per check.
        verify_levels: a debugging aid: whenever the levels are decided (at every check, or
            every window under a policy that reads no norms), gather each rank's levels and
            raise on every rank if any differ (one small allgather, not counted as traffic).
            ``None`` (the default) reads ``HOROVOD_ACCORDION_VERIFY_LEVELS=1`` from the
            environment, which the test suite sets.
        log: a ``CommunicationLog``.
        describe: a function of the new levels that returns extra fields for each check
            record (the batch variant logs the batch size in force).
        compressed_layers: the indices of the layers whose level means something, those the
            compression compresses: the others (1-D tensors, matrices too small to gain) are
            decided on too, but their level is never used, so ``named_levels`` and the log
            leave them out. ``None``: every layer (a batch size applies to all).
        policy: how the levels are chosen from the ladder, see ``horovod_accordion.core.policies``:
            ``"accordion"`` (the default), ``"error_budget"``, or a policy object.
    """

    def __init__(self, layer_names, levels, eta=0.5, interval=10, window_steps=None,
                 per_layer=True, lr_decay_factor=2.0, delta_windows=1, check_norm="local", verify_levels=None,
                 log=None, describe=None, compressed_layers=None, policy=None):
        if window_steps is not None and (int(window_steps) != window_steps or window_steps < 1):
            raise ValueError(f"window_steps must be a positive integer or None (epochs), got {window_steps!r}")
        if isinstance(delta_windows, bool) or not isinstance(delta_windows, int) or not 1 <= delta_windows <= interval:
            raise ValueError(f"delta_windows must be an integer in [1, interval={interval}], got {delta_windows!r}")
        if check_norm not in ("local", "averaged"):
            raise ValueError(f"check_norm must be 'local' or 'averaged', got {check_norm!r}")
        self.layer_names = list(layer_names)
        self.compressed_layers = range(len(self.layer_names)) if compressed_layers is None \
            else sorted(compressed_layers)
        self.ladder = tuple(levels)
        self.low, self.high = self.ladder[0], self.ladder[-1]
        self.switches_batch = compressed_layers is None  # the levels are micro-batches per step
        self.policy = policy_for(policy, self.ladder, batch_switch=self.switches_batch)
        self._reducer = None  # for the level costs, once ``attach`` gives it
        self.window_steps = window_steps
        self.delta_windows = delta_windows
        self.check_norm = check_norm
        self.verify_levels = os.environ.get("HOROVOD_ACCORDION_VERIFY_LEVELS") == "1" \
            if verify_levels is None else verify_levels
        self.detector = RegimeDetector(len(self.layer_names), eta=eta, interval=interval,
                                       per_layer=per_layer, lr_decay_factor=lr_decay_factor)
        self.log = log if log is not None else CommunicationLog()
        self.describe = describe
        self.step = 0
        self.micro_batches_accumulated = 0
        self._levels = self._decide()

    def attach(self, reducer):
        """Start ``reducer`` at this schedule's levels. A policy other than Accordion's weighs
        the bytes of each compressed layer at each ladder level, which the reducer knows."""
        if self.policy.weighs_costs:
            self._reducer = reducer
            self._levels = self._decide()
        self.apply_levels(reducer)

    def apply_levels(self, reducer):
        """Give ``reducer`` the levels now in force. A batch switch's levels are micro-batch
        counts: its compression keeps the one level it was made with."""
        if not self.switches_batch:
            reducer.set_levels(self.levels)

    @property
    def level_costs(self):
        """The compressed layers' bytes per ladder level, at today's world size: TopK's sparse
        or dense wire depends on it, and an elastic reset changes it between checks."""
        return self._reducer.level_costs(self.ladder) if self._reducer is not None else {}

    def _decide(self, errors=None):
        return self.policy.decide(self.ladder, self.detector.critical, self.detector.windows_seen,
                                  current=getattr(self, "_levels", None), errors=errors, costs=self.level_costs)

    @property
    def adaptive(self):
        return self.low != self.high

    @property
    def levels(self):
        """Each layer's level now, in the order of ``layer_names``."""
        return list(self._levels)

    @property
    def named_levels(self):
        """Each compressed layer's level now, by name (see ``compressed_layers``)."""
        levels = self.levels
        return {self.layer_names[k]: levels[k] for k in self.compressed_layers}

    def observe_lr(self, lr):
        """Returns ``True`` if a learning-rate decay event just switched every layer to ℓ_low.
        A policy that reads no norms switches nothing on a decay; its checks still log the rate."""
        if not self.detector.observe_lr(lr) or not self.policy.reads_norms:
            return False
        self._levels = self._decide()
        self.log.record_decay(self.step, lr, self.named_levels.items())
        return True

    def step_done(self, micro_batches=1):
        """Count one optimizer step. Returns ``True`` when a step-based window is complete."""
        self.step += 1
        self.micro_batches_accumulated += micro_batches
        if self.step == NO_WINDOW_WARNING_STEPS and self.window_steps is None:
            warn_if_no_window_closed(self, "end_epoch() (on the optimizer, the DDP or FSDP state, or the TF state) "
                                           "unless your epochs are longer than this")
        return self.window_steps is not None and self.step % self.window_steps == 0

    @property
    def keeps_delta(self):
        """Whether the exchange needs a Δ per layer at all: not for a fixed level, nor for a
        policy that reads no norms."""
        return self.adaptive and self.policy.reads_norms

    @property
    def window_is_check(self):
        """Whether the window now running ends in a check, where Δ is reduced and decided on."""
        return self.keeps_delta and self.detector.next_window_is_check

    @property
    def window_accumulates(self):
        """Only the last ``delta_windows`` windows before a check need their gradients in Δ."""
        return self.keeps_delta and \
            -self.detector.windows_seen % self.detector.interval < self.delta_windows

    @property
    def window_empties_delta(self):
        """Δ starts again after a check, and after any window that feeds no check."""
        return self.window_is_check or not self.window_accumulates

    def end_window(self, mean_squared_norms=None, errors=None, **log_extra):
        """Close the window; at a check, with each layer's squared norm of the accumulated
        gradient, averaged over ranks. Norms are divided by the micro-batches in Δ, so a
        change in batch size or window length alone does not look like a regime change.
        ``errors``: the policy's ``{layer: [squared error per ladder level]}``, averaged over
        ranks. Returns ``True`` if the levels were decided again.
        """
        scale = max(self.micro_batches_accumulated, 1)
        if self.window_empties_delta:
            self.micro_batches_accumulated = 0
        if not self.adaptive:
            # A fixed level decides nothing, but its windows pass as an adaptive run's do, so
            # the decay rule compares the rate with the last two windows' (not the run's peak)
            # and its log shows the decay events an adaptive run on the same schedule sees.
            self.detector.pass_window()
            return False
        window = self.detector.windows_seen
        # The window's highest rate (None if none was observed), so that a log without epoch
        # records still plots its schedule.
        lr = self.detector.lr_current_window
        if not self.policy.reads_norms:
            self.detector.pass_window()
            self._levels = self._decide()
            self.log.record_check(self.step, window, self.named_levels.items(), (), (), lr=lr, **log_extra)
            return True
        if mean_squared_norms is None:
            return self.detector.end_window()
        norms = [math.sqrt(s) / scale if s >= 0 else float("nan") for s in mean_squared_norms]
        if not self.detector.end_window(norms):
            return False
        self._levels = self._decide(errors)
        if errors:
            log_extra["errors"] = {self.layer_names[k]: row for k, row in errors.items()}
        ratios = self.detector.last_ratios
        if not self.detector.per_layer:
            ratios = ratios * len(self.layer_names)
        self.log.record_check(
            self.step, window, self.named_levels.items(),
            zip(self.layer_names, ratios), zip(self.layer_names, norms), lr=lr,
            **log_extra, **(self.describe(self.levels) if self.describe else {}))
        return True

    def state_dict(self):
        """The schedule, with the check history, so that a resumed run's stats stay whole."""
        return {"detector": self.detector.state_dict(), "step": self.step,
                "micro_batches_accumulated": self.micro_batches_accumulated,
                "levels": self.ladder, "current_levels": list(self._levels), "policy": repr(self.policy),
                "layer_names": self.layer_names, "checks": list(self.log.checks)}

    def check_compatible(self, state):
        """Raise a ``ValueError`` that says what differs if ``state`` is another configuration's."""
        if tuple(state["levels"]) != self.ladder:
            raise ValueError(f"checkpoint levels {tuple(state['levels'])} differ from this optimizer's {self.ladder}")
        saved_policy = state.get("policy", repr(make_policy(None)))
        if saved_policy != repr(self.policy):
            raise ValueError(f"the checkpoint was saved with policy {saved_policy}, this optimizer has {self.policy!r}")
        if list(state["layer_names"]) != self.layer_names:
            only_one_side = sorted(set(state["layer_names"]) ^ set(self.layer_names))
            raise ValueError(f"checkpoint layer names differ from this model's parameters"
                             f"{': ' + ', '.join(only_one_side[:5]) if only_one_side else ' (their order differs)'}")
        self.detector.check_compatible(state["detector"])

    def load_state_dict(self, state):
        self.check_compatible(state)
        self.detector.load_state_dict(state["detector"])
        self.log.checks = list(state.get("checks", self.log.checks))
        self.step = state["step"]
        self.micro_batches_accumulated = state["micro_batches_accumulated"]
        self._levels = list(state["current_levels"]) if "current_levels" in state else self._decide()


def warn_at_exit_if_no_window_closed(owner, accordion, closer):
    """Where windows are epochs: warn when ``owner`` (the adapter) is collected, or at exit, if
    ``accordion`` never closed one. The misuse is certain only once training is over. ``closer``
    is the call that closes a window, as the user writes it."""
    if accordion.adaptive and accordion.window_steps is None:
        weakref.finalize(owner, warn_if_no_window_closed, accordion, closer)


def warn_if_no_window_closed(accordion, closer):
    if accordion.adaptive and accordion.step > 0 and accordion.detector.windows_seen == 0:
        warnings.warn(
            f"Accordion ran {accordion.step} steps and never closed a detection window, so every layer "
            f"stayed at ℓ_low ({accordion.low}): call {closer} at the end of every epoch, or "
            f"pass window_steps=N", RuntimeWarning)
