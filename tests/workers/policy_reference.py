"""The level policies' reference, shared by the unit tests and the workers of every backend:
the least-cost levels by exhaustive search, and what each logged check should have decided."""
import itertools
import math

from horovod_accordion.core.policies import BUDGET_UNITS


def exhaustive_costs(errors, costs, budget):
    """The least summed cost of any choice of one level per layer whose summed error is ≤
    ``budget`` (``math.inf`` if none), and the same under the budget less the dynamic
    program's rounding: ``len(errors)`` of its ``BUDGET_UNITS`` parts."""
    tightened = budget * (1 - len(errors) / BUDGET_UNITS)
    best = [math.inf, math.inf]
    for choice in itertools.product(*(range(len(row)) for row in errors)):
        error = sum(row[j] for row, j in zip(errors, choice))
        cost = sum(row[j] for row, j in zip(costs, choice))
        for k, limit in enumerate((budget, tightened)):
            if error <= limit:
                best[k] = min(best[k], cost)
    return best


def assert_cheapest(picked, errors, costs, budget):
    """``picked`` (one ladder index per layer) fits ``budget`` and costs no more than the
    exhaustive optimum under the budget less the rounding, nor less than the exact one."""
    error = sum(row[j] for row, j in zip(errors, picked))
    cost = sum(row[j] for row, j in zip(costs, picked))
    optimum, tightened = exhaustive_costs(errors, costs, budget)
    if optimum == math.inf:
        assert picked == [0] * len(errors), picked
        return
    assert error <= budget * (1 + 1e-12), (picked, error, budget)
    assert optimum <= cost <= tightened, (picked, cost, optimum, tightened)


def assert_checks_decided_by_error_budget(records, ladder, costs, slack, eta):
    """Every check of a run's log (``records``) against the reference: its critical layers
    (ratio ≥ ``eta``, or the first check) at ℓ_low, and the others at least-cost levels
    within ``slack`` × their ℓ_low error, from the error table the check logged. ``costs``:
    {layer name: bytes per ladder level}. Returns how many checks used a middle level."""
    checks = [r for r in records if r["event"] == "check"]
    assert checks, "no check was logged"
    middle = 0
    for record in checks:
        levels, ratios = record["levels"], record["ratios"]
        free = [name for name in levels if ratios[name] is not None and ratios[name] < eta]
        for name in levels:
            if name not in free:
                assert levels[name] == ladder[0], (record["step"], name, levels)
        if free:
            errors = [record["errors"][name] for name in free]
            budget = slack * sum(row[0] for row in errors)
            assert_cheapest([list(ladder).index(levels[name]) for name in free], errors,
                            [costs[name] for name in free], budget)
        middle += any(level not in (ladder[0], ladder[-1]) for level in levels.values())
    return middle


def phase_levels(ladder, window, total_windows, costs):
    """The phase schedule's levels for ``window``, by name, computed apart from the policy."""
    phase = min(len(ladder) - 1, len(ladder) * window // total_windows)
    sizes = sorted(row[0] for row in costs.values())
    median = sizes[(len(sizes) - 1) // 2]
    return {name: ladder[min(len(ladder) - 1, phase + (row[0] > median))] for name, row in costs.items()}


def reference_costs(named_shapes, compression, size):
    """{name: bytes per step at each ladder level} of the layers ``compression`` compresses,
    from the shapes alone: PowerSGD sends P and Q in fp32, (n + m)·r floats; TopK the kept
    values and their indices (int16 to 32,768 entries, two to a word) while that is cheaper
    on a ring of ``size`` than the dense layer, else the dense layer. An allgather's payload
    weighs ``size``/2 × its bytes, as the links carry it against an allreduce."""
    costs = {}
    for name, shape in named_shapes:
        if len(shape) < 2:
            continue
        numel = math.prod(shape)
        if hasattr(compression, "low_rank"):
            n, m = shape[0], numel // shape[0]  # the transposed layout (TF) has the same n + m
            if n + m and (n + m) * compression.low_rank * compression.min_compression_rate < n * m:
                costs[name] = [4 * (n + m) * min(rank, n, m) for rank in compression.levels]
            continue
        index_bytes = 2 if numel <= 2 ** 15 else 4
        row = []
        for fraction in compression.levels:
            kept = max(1, int(fraction * numel))
            sparse = kept * (4 + index_bytes) * size < 8 * numel
            words = kept + ((kept + 1) // 2 if index_bytes == 2 else kept)
            row.append(4 * words * size / 2 if sparse else 4 * numel)  # as the links carry them
        costs[name] = row
    return costs


def assert_policy_checks(policy, checks, ladder, costs, first_levels, eta=0.5):
    """A run's logged ``checks`` and its levels before the first (``first_levels``, by name)
    against the reference of ``policy`` (an ErrorBudget or a PhaseSchedule). Returns how many
    checks put a layer at a middle level of the ladder."""
    if hasattr(policy, "total_windows"):
        assert first_levels == phase_levels(ladder, 0, policy.total_windows, costs), first_levels
        for record in checks:
            assert record["levels"] == phase_levels(ladder, record["window"] + 1, policy.total_windows, costs), record
        return sum(any(v not in (ladder[0], ladder[-1]) for v in r["levels"].values()) for r in checks)
    assert first_levels == {name: ladder[0] for name in costs}, first_levels
    return assert_checks_decided_by_error_budget(checks, ladder, costs, policy.slack, eta)


def set_regime(schedule, critical):
    """Put ``schedule``'s layers in the regimes ``critical``, as a check that found them would:
    its policy decides the levels from them (the detector's flags alone change no level)."""
    schedule.detector.critical = list(critical)
    schedule._levels = schedule._decide()
