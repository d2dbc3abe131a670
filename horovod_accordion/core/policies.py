"""Level policies: how much each layer is compressed, from a ladder of levels.

Accordion's detector decides *when* training is in a critical regime; a policy turns what
a window shows into one level per layer, from the compression's ladder (``PowerSGD(4, 1,
ladder=(4, 2, 1))``: ℓ_low first, ℓ_high last). No framework is imported here: the
adapters measure, the schedule (``horovod_accordion.core.schedule``) asks the policy.

* ``AccordionPolicy`` (``"accordion"``, the default): ℓ_low for critical layers, ℓ_high
  for the others (Agarwal et al., MLSys 2021). The ladder's middle levels go unused.
* ``ErrorBudget`` (``"error_budget"``, after L-GreCo, Markov et al., MLSys 2024):
  critical layers at ℓ_low; every other compressed layer at the cheapest ladder level such
  that their summed compression error stays within ``slack`` times what ℓ_low would give
  them. At each check it measures ‖Δ − C_level(Δ)‖² per layer and level on each rank's own
  window gradient Δ, averages that table over ranks in the check's allreduce, so every
  rank decides alike, and solves the knapsack by dynamic programming (``cheapest_levels``).
* ``PhaseSchedule`` (``"phase"``, after LEGACY, ICLR 2026): no statistics at all. The
  level follows the training phase (the ladder in equal thirds, halves, ... of
  ``total_windows``) and the layer's size on the wire (layers whose ℓ_low bytes are above the
  median one step harder).
  It is the cheap baseline that says whether measuring earns its cost.
"""

import math
import warnings

__all__ = ["AccordionPolicy", "ErrorBudget", "PhaseSchedule", "cheapest_levels", "make_policy", "policy_for"]

# The error budget is cut into this many units: see ``cheapest_levels`` for the gap it allows.
BUDGET_UNITS = 1000


class AccordionPolicy:
    """Two levels: ℓ_low while a layer is critical, ℓ_high otherwise.

    A policy of your own subclasses this one and overrides ``decide``. Its class attributes say
    what the adapters must give it: ``reads_norms`` (the window norms, hence a Δ per layer and
    the decay rule), ``measures_errors`` (``errors`` at each check) and ``weighs_costs``
    (``costs``; it needs a ladder of more than one level, and is refused without one).
    """

    reads_norms = True
    measures_errors = False
    weighs_costs = False

    def decide(self, ladder, critical, window=0, current=None, errors=None, costs=None):
        return [ladder[0] if c else ladder[-1] for c in critical]

    def __repr__(self):
        """Checkpoints and the cross-rank check compare policies by this: a policy with
        parameters names them in its own."""
        return f"{type(self).__qualname__}()"


class ErrorBudget(AccordionPolicy):
    """Critical layers at ℓ_low; the others at the fewest bytes whose summed error stays
    within ``slack`` × their summed error at ℓ_low.

    Args:
        slack: how much more compression error than uniform ℓ_low the non-critical layers
            may have together (≥ 1; at 1 only uniform ℓ_low fits). Error feedback sends what
            a step leaves out in later steps, which is why some slack costs little accuracy.

    Cost per check: per compressed layer and ladder level, one power iteration (PowerSGD:
    two matmuls and an orthogonalisation of Δ's size) or one top-k (TopK) on the window's Δ,
    and len(layers) × len(ladder) more fp64 values in the check's allreduce.
    """

    measures_errors = True
    weighs_costs = True

    def __init__(self, slack=2.0):
        if not (isinstance(slack, (int, float)) and not isinstance(slack, bool) and slack >= 1 and math.isfinite(slack)):
            raise ValueError(f"ErrorBudget slack must be a finite number >= 1, got {slack!r}")
        self.slack = float(slack)

    def decide(self, ladder, critical, window=0, current=None, errors=None, costs=None):
        """``errors`` and ``costs``: ``{layer: [value per ladder level]}`` for the compressed
        layers (squared errors averaged over ranks; bytes per rank on the wire)."""
        levels = super().decide(ladder, critical)
        chosen = [k for k in sorted(errors or {}) if not critical[k]]
        if not chosen:
            return levels
        table = [errors[k] for k in chosen]
        if not all(math.isfinite(e) for row in table for e in row):
            warnings.warn("Accordion error_budget: a non-finite compression error at this check; the non-critical "
                          "layers keep their levels", RuntimeWarning, stacklevel=2)
            return [current[k] if k in chosen else level for k, level in enumerate(levels)]
        budget = self.slack * sum(row[0] for row in table)
        for k, index in zip(chosen, cheapest_levels(table, [costs[k] for k in chosen], budget)):
            levels[k] = ladder[index]
        return levels

    def __repr__(self):
        return f"ErrorBudget(slack={self.slack!r})"


class PhaseSchedule(AccordionPolicy):
    """The ladder walked down over training, harder on large layers; no statistics.

    Window w of ``total_windows`` is in phase ⌊len(ladder)·w / total_windows⌋; a layer runs
    at that phase's ladder level, one level further for layers whose ℓ_low bytes are above
    the median of the compressed layers (capped at ℓ_high). Decided at every window; decay
    events and norms are ignored, so no Δ is kept and no norm is reduced.

    Args:
        total_windows: the windows of the whole training (its epochs, or steps / window_steps).
    """

    reads_norms = False
    weighs_costs = True

    def __init__(self, total_windows):
        if isinstance(total_windows, bool) or not isinstance(total_windows, int) or total_windows < 1:
            raise ValueError(f"PhaseSchedule total_windows must be a positive integer, got {total_windows!r}")
        self.total_windows = total_windows

    def decide(self, ladder, critical, window=0, current=None, errors=None, costs=None):
        """``costs``: ``{layer: [bytes per ladder level]}``; a layer's size is its ℓ_low cost."""
        phase = min(len(ladder) - 1, len(ladder) * window // self.total_windows)
        sizes = {k: row[0] for k, row in (costs or {}).items()}
        median = sorted(sizes.values())[(len(sizes) - 1) // 2] if sizes else 0
        return [ladder[min(len(ladder) - 1, phase + (sizes.get(k, 0) > median))] for k in range(len(critical))]

    def __repr__(self):
        return f"PhaseSchedule(total_windows={self.total_windows!r})"


def policy_for(policy, ladder, batch_switch=False):
    """``make_policy``, refusing a policy other than Accordion's with a batch switch (the
    policies choose compression levels, not batch sizes), and one that weighs the levels' costs
    where it has nothing to choose: with a fixed level (a static or plain compression)."""
    policy = make_policy(policy)
    if batch_switch and type(policy) is not AccordionPolicy:
        raise ValueError(f"policy {policy!r} chooses compression levels: with batch_switch, keep the "
                         f"default policy='accordion'")
    if not policy.weighs_costs:
        return policy
    if len(set(ladder)) < 2:
        fixed = "no levels (every layer travels dense)" if ladder[0] is None else f"one level ({ladder[0]})"
        raise ValueError(f"policy {policy!r} chooses each layer's level from a ladder, and this compression has "
                         f"{fixed}: pass an adaptive one (PowerSGD(low, high), TopK(low, high), "
                         f"or a ladder), or leave policy='accordion'")
    return policy


def make_policy(policy):
    """A policy object from ``policy``: one of this module's policies, or a name."""
    if isinstance(policy, AccordionPolicy):
        return policy
    if policy is None or policy == "accordion":
        return AccordionPolicy()
    if policy == "error_budget":
        return ErrorBudget()
    if policy == "phase":
        raise ValueError("policy='phase' needs the length of training: pass PhaseSchedule(total_windows=EPOCHS)")
    raise ValueError(f"policy must be 'accordion', 'error_budget', ErrorBudget(slack), or "
                     f"PhaseSchedule(total_windows), got {policy!r}")


def cheapest_levels(errors, costs, budget, units=BUDGET_UNITS):
    """The ladder index per layer with the least summed cost whose summed error is ≤ ``budget``.

    ``errors[l][j]`` and ``costs[l][j]``: layer l at ladder level j. A dynamic program over the
    budget cut into ``units`` equal parts, each error rounded *up* to whole parts: the choice
    always fits the true budget, and costs no more than the best choice under a budget
    smaller by ``len(errors)`` parts (the rounding's worst case), so the gap to the exact
    optimum is what ``len(errors) / units`` of the budget buys. Among equal costs, the choice
    with the least rounded error wins. With no positive budget, or nothing that fits, every layer stays at
    index 0 (ℓ_low).
    """
    if budget <= 0 or not errors:
        return [0] * len(errors)
    unit = budget / units
    infinity = math.inf
    best = [0.0] + [infinity] * units  # least cost using exactly b parts so far
    choices = []
    for row_errors, row_costs in zip(errors, costs):
        weights = [math.ceil(e / unit) if e <= budget else None for e in row_errors]
        after = [infinity] * (units + 1)
        choice = [None] * (units + 1)
        for used, cost in enumerate(best):
            if cost == infinity:
                continue
            for j, (weight, level_cost) in enumerate(zip(weights, row_costs)):
                if weight is None or used + weight > units:
                    continue
                if cost + level_cost < after[used + weight]:
                    after[used + weight] = cost + level_cost
                    choice[used + weight] = (j, used)
        best = after
        choices.append(choice)
    if min(best) == infinity:
        return [0] * len(errors)
    used = min(range(units + 1), key=lambda b: (best[b], b))
    picked = []
    for choice in reversed(choices):
        j, used = choice[used]
        picked.append(j)
    return picked[::-1]
