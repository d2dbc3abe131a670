"""Accordion's critical-regime detector (Agarwal et al., MLSys 2021, Algorithm 1).

A pure state machine: its inputs are accumulated-gradient norms and learning rates,
its output is one flag per layer, ``critical`` (use the low-compression level ℓ_low)
or not (use ℓ_high). No framework is imported here; the torch and TensorFlow
adapters compute the norms and apply the flags.

The rule, checked at every ``interval``-th window::

    |‖Δ_old‖ − ‖Δ_curr‖| / ‖Δ_old‖ ≥ eta   ⇒  critical

where Δ_curr is the gradient accumulated over the current window (an epoch, or a
number of steps) and Δ_old the one of the window ``interval`` windows earlier.

How this differs from the authors' code, on purpose (spec §8-9):

* The norms must be *global*: adapters allreduce the per-layer squared norms of the
  local accumulated gradients, so every rank feeds the same numbers and takes the same
  decisions. The authors decided on rank 0's local shard and broadcast the result.
* A *decay event* is a drop of the learning rate by at least ``lr_decay_factor`` that
  happens within one window: the rate now is compared with the highest rate of this
  window and the one before it. A step schedule (÷10) fires at each step, as the
  authors' ``lr_next < lr`` does. A smooth schedule (cosine, linear) is left to the
  norm rule: its rate falls by a factor 2 within one epoch only in its last one or two
  epochs, so a long cosine fires at most twice, where a drop counted from the last event
  would fire again and again and keep ℓ_low through its tail. A warm-up only
  raises the rate and never fires.
* A non-finite norm never changes a level: the layer keeps its flag and a warning is
  emitted.
"""

import math
import warnings

__all__ = ["RegimeDetector"]


class RegimeDetector:
    """Decides, per layer or for the whole model, whether training is in a critical regime.

    Args:
        num_layers: number of gradient tensors the adapter reports norms for.
        eta: relative change of the accumulated-gradient norm that marks a critical
            regime. The paper and the authors' code use 0.5.
        interval: check every ``interval`` windows, comparing window ``w`` with
            ``w - interval``. The paper uses 10 epochs for CNNs, 5 for the LSTM.
        per_layer: one decision per layer (the paper). ``False`` takes one decision
            for the whole model from the global norm sqrt(Σ‖Δ_l‖²).
        lr_decay_factor: a learning rate at least this many times below the highest
            rate of the current and the previous window is a decay event, which marks
            every layer critical until the next check. ``None`` disables the rule.
    """

    def __init__(self, num_layers, eta=0.5, interval=10, per_layer=True, lr_decay_factor=2.0):
        if int(num_layers) != num_layers or num_layers < 1:
            raise ValueError(f"num_layers must be a positive integer, got {num_layers!r}")
        if not (isinstance(eta, (int, float)) and eta > 0 and math.isfinite(eta)):
            raise ValueError(f"eta must be a positive finite number, got {eta!r}")
        if int(interval) != interval or interval < 1:
            raise ValueError(f"interval must be a positive integer number of windows, got {interval!r}")
        if lr_decay_factor is not None and not lr_decay_factor > 1:
            raise ValueError(
                f"lr_decay_factor must be > 1 (a drop to 1/factor of the rate is a decay event) "
                f"or None to disable the rule, got {lr_decay_factor!r}")
        self.num_layers = int(num_layers)
        self.eta = float(eta)
        self.interval = int(interval)
        self.per_layer = bool(per_layer)
        self.lr_decay_factor = lr_decay_factor
        # Training starts critical: the authors' epoch 0 runs at --k-start = ℓ_low.
        self.critical = [True] * self.num_layers
        self.windows_seen = 0
        self.last_check_norms = None
        self.last_ratios = None
        # The highest learning rates of the previous and of the current window.
        self.lr_previous_window = None
        self.lr_current_window = None
        # A fast anneal (OneCycleLR) halves the rate several times in one window; only the
        # first drop tells the next check anything, so a window has at most one decay event.
        self.decayed_this_window = False

    @property
    def next_window_is_check(self):
        """Whether the window now running ends in a check: only those need norms."""
        return self.windows_seen % self.interval == 0

    def end_window(self, norms=None):
        """Report the accumulated-gradient norms of the window that just ended.

        ``norms`` holds one global norm per layer; it may be ``None`` for a window that
        is not a check. Returns ``True`` if this window was a check (the flags in
        ``self.critical`` were re-evaluated), else ``False``.
        """
        window = self.windows_seen
        if window % self.interval != 0:
            self.pass_window()
            return False
        self._next_lr_window()
        if norms is None or len(norms) != self.num_layers:
            raise ValueError(f"window {window} is a check: expected {self.num_layers} norms, got "
                             f"{None if norms is None else len(norms)}")
        norms = [float(n) for n in norms]
        self.windows_seen += 1
        if not self.per_layer:
            norms = [math.sqrt(sum(n * n for n in norms))]
        previous = self.last_check_norms
        if previous is None:
            decisions = [True] * len(norms)  # the first check forces ℓ_low
            ratios = [None] * len(norms)
        else:
            ratios = [_relative_change(old, new) for old, new in zip(previous, norms)]
            decisions = [None if r is None else r >= self.eta for r in ratios]
        if any(d is None for d in decisions):
            bad = [i for i, d in enumerate(decisions) if d is None]
            warnings.warn(
                f"Accordion: non-finite accumulated-gradient norm at window {window} for "
                f"{'layers ' + str(bad) if self.per_layer else 'the whole model'}; keeping the current levels",
                RuntimeWarning, stacklevel=2)
        if self.per_layer:
            self.critical = [c if d is None else d for c, d in zip(self.critical, decisions)]
        elif decisions[0] is not None:
            self.critical = [decisions[0]] * self.num_layers
        # A non-finite norm must not become the next check's reference either.
        self.last_check_norms = [
            n if math.isfinite(n) else (previous[i] if previous else n) for i, n in enumerate(norms)]
        self.last_ratios = ratios
        return True

    def pass_window(self):
        """Close a window without deciding: one that is not a check, every window of a
        policy that reads no norms, and every window of a fixed level."""
        self._next_lr_window()
        self.windows_seen += 1

    def _next_lr_window(self):
        self.decayed_this_window = False
        if self.lr_current_window is not None:
            self.lr_previous_window, self.lr_current_window = self.lr_current_window, None

    def observe_lr(self, lr):
        """Report the learning rate in force. Returns ``True`` on a decay event."""
        if lr is None:
            return False
        lr = float(lr)
        reference = max((r for r in (self.lr_previous_window, self.lr_current_window) if r is not None),
                        default=lr)
        # Kept without the decay rule too: each check logs its window's rate.
        self.lr_current_window = lr if self.lr_current_window is None else max(self.lr_current_window, lr)
        if self.lr_decay_factor is None or lr >= reference or lr * self.lr_decay_factor > reference \
                or self.decayed_this_window:
            return False
        # The drop is used up: later steps at the new rate must not fire again.
        self.lr_previous_window, self.lr_current_window = None, lr
        self.decayed_this_window = True
        self.critical = [True] * self.num_layers
        return True

    def state_dict(self):
        return {
            "num_layers": self.num_layers, "eta": self.eta, "interval": self.interval,
            "per_layer": self.per_layer, "lr_decay_factor": self.lr_decay_factor,
            "critical": list(self.critical), "windows_seen": self.windows_seen,
            "last_check_norms": None if self.last_check_norms is None else list(self.last_check_norms),
            "last_ratios": None if self.last_ratios is None else list(self.last_ratios),
            "lr_previous_window": self.lr_previous_window, "lr_current_window": self.lr_current_window,
            "decayed_this_window": self.decayed_this_window,
        }

    def check_compatible(self, state):
        if state["num_layers"] != self.num_layers:
            raise ValueError(
                f"detector state is for {state['num_layers']} layers, this model has {self.num_layers}")

    def load_state_dict(self, state):
        """Resume ``state``, with its ``eta``, ``interval``, ``per_layer`` and ``lr_decay_factor``:
        its norms and windows were measured under them. A warning names each one that differs
        from this detector's own arguments."""
        self.check_compatible(state)
        differ = [f"{key}={state[key]!r} (constructed with {getattr(self, key)!r})"
                  for key in ("eta", "interval", "per_layer", "lr_decay_factor") if state[key] != getattr(self, key)]
        if differ:
            warnings.warn(f"the checkpoint's detector was configured with {', '.join(differ)}: the checkpoint's "
                          f"values win, as its norms and windows were measured under them", RuntimeWarning)
        for key in ("eta", "interval", "per_layer", "lr_decay_factor", "windows_seen",
                    "last_check_norms", "last_ratios", "lr_previous_window", "lr_current_window"):
            setattr(self, key, state[key])
        self.decayed_this_window = state.get("decayed_this_window", False)
        self.critical = list(state["critical"])


def _relative_change(old, new):
    """|old − new| / old; ``None`` if either norm is not finite. A zero old norm is critical."""
    if not (math.isfinite(old) and math.isfinite(new)):
        return None
    if old == 0:
        return math.inf
    return abs(old - new) / old
