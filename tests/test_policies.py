"""The level policies and the ladders, without a collective: their decisions against an
exhaustive search, their error tables against numpy in fp64, and their schedule's bookkeeping.
The decisions on real ranks are in the workers' checks (torch, DDP, TF)."""
import json
import math
import pathlib
import types

import numpy as np
import pytest
import torch

from horovod_accordion.core.schedule import Accordion
from horovod_accordion.core.batch import BatchSwitch, schedule_arguments
from horovod_accordion.core.compression import PowerSGD, TopK, kept_count
from horovod_accordion.core.exchange import BucketedExchange
from horovod_accordion.core.policies import (AccordionPolicy, ErrorBudget, PhaseSchedule, cheapest_levels,
                                        make_policy, policy_for)
from horovod_accordion.core.reducers import PowerSGDReducer, TopKReducer, make_reducer
from horovod_accordion.core.collectives import Collectives
from horovod_accordion.torch_common.tensors import TorchTensorOps
from tests.workers.models import Float64State
from tests.workers.policy_reference import assert_cheapest, exhaustive_costs


@pytest.mark.parametrize("seed", range(60))
def test_the_dynamic_program_is_feasible_and_within_its_stated_gap_of_the_exhaustive_optimum(seed):
    rng = np.random.RandomState(seed)
    layers, rungs = rng.randint(1, 6), rng.randint(2, 5)
    # Errors rise and costs fall along the ladder, as they do for real compressors.
    errors = np.cumsum(rng.exponential(1.0, (layers, rungs)), axis=1).tolist()
    costs = np.cumsum(rng.exponential(1.0, (layers, rungs))[:, ::-1], axis=1)[:, ::-1].tolist()
    budget = rng.uniform(1.0, 3.0) * sum(row[0] for row in errors)
    assert_cheapest(cheapest_levels(errors, costs, budget), errors, costs, budget)


def test_exact_ties_and_degenerate_budgets():
    # Two choices of equal cost: the one with less error wins.
    assert cheapest_levels([[1.0, 2.0]], [[5.0, 5.0]], 10.0) == [0]
    assert cheapest_levels([[1.0, 2.0]], [[5.0, 1.0]], 10.0) == [1]
    # Nothing but ℓ_low fits, or no budget at all: ℓ_low.
    assert cheapest_levels([[1.0, 9.0], [1.0, 9.0]], [[2.0, 1.0]] * 2, 2.0) == [0, 0]
    assert cheapest_levels([[0.0, 1.0]], [[2.0, 1.0]], 0.0) == [0]
    assert cheapest_levels([], [], 1.0) == []


def test_error_budget_keeps_critical_layers_at_low_and_weighs_the_others():
    ladder = (4, 2, 1)
    errors = {0: [1.0, 2.0, 5.0], 2: [1.0, 3.0, 9.0], 3: [4.0, 4.5, 5.0]}
    costs = {0: [12.0, 6.0, 3.0], 2: [12.0, 6.0, 3.0], 3: [40.0, 20.0, 10.0]}
    critical = [False, False, True, False]
    levels = ErrorBudget(slack=2.0).decide(ladder, critical, errors=errors, costs=costs)
    assert levels[2] == 4  # critical
    assert levels[1] == 1  # compresses nothing: Accordion's rule, never used
    free = [0, 3]
    budget = 2.0 * (1.0 + 4.0)
    assert exhaustive_costs([errors[k] for k in free], [costs[k] for k in free], budget)[0] == \
        sum(costs[k][ladder.index(levels[k])] for k in free)
    # Slack 1 allows no more error than ℓ_low's; a huge slack takes ℓ_high everywhere.
    assert ErrorBudget(1.0).decide(ladder, critical, errors=errors, costs=costs) == [4, 1, 4, 4]
    assert ErrorBudget(1e9).decide(ladder, critical, errors=errors, costs=costs) == [1, 1, 4, 1]


def test_a_non_finite_error_keeps_the_current_levels():
    errors = {0: [1.0, float("nan")], 1: [1.0, 2.0]}
    with pytest.warns(RuntimeWarning, match="non-finite compression error"):
        levels = ErrorBudget().decide((2, 1), [False, False], current=[2, 2], errors=errors,
                                      costs={0: [2, 1], 1: [2, 1]})
    assert levels == [2, 2]


def test_the_phase_schedule_walks_the_ladder_harder_on_large_layers():
    policy = PhaseSchedule(total_windows=6)
    costs = {0: [400, 200, 100], 1: [40, 20, 10], 2: [4000, 2000, 1000]}  # median 400: layer 2 is large
    table = [policy.decide((4, 2, 1), [True] * 4, window, costs=costs) for window in range(8)]
    assert table == [[4, 4, 2, 4]] * 2 + [[2, 2, 1, 2]] * 2 + [[1, 1, 1, 1]] * 4


def test_policies_by_name_and_their_errors():
    assert isinstance(make_policy(None), AccordionPolicy) and isinstance(make_policy("accordion"), AccordionPolicy)
    assert make_policy("error_budget").slack == 2.0
    with pytest.raises(ValueError, match="total_windows"):
        make_policy("phase")
    with pytest.raises(ValueError, match="policy must be"):
        make_policy("l-greco")
    for bad in (0.5, float("inf"), True):
        with pytest.raises(ValueError, match="slack"):
            ErrorBudget(bad)
    with pytest.raises(ValueError, match="total_windows"):
        PhaseSchedule(0)
    with pytest.raises(ValueError, match="batch_switch"):
        Accordion(["a"], (1, 4), policy="error_budget")  # compressed_layers=None: a batch switch


@pytest.mark.parametrize("make, message", [
    (lambda: PowerSGD(4, 1, ladder=(4, 3, 3, 1)), "ladder"),
    (lambda: PowerSGD(4, 1, ladder=(2, 1)), "ladder"),
    (lambda: PowerSGD(4, 1, ladder=(4, 2.5, 1)), "ladder"),
    (lambda: PowerSGD(4, 1, ladder=(4,)), "ladder"),
    (lambda: PowerSGD(4, 1, ladder=(4.0, 1.0)), "ladder"),  # equal to (low, high), yet no rank
    (lambda: TopK(0.5, 0.1, ladder=(0.5, 0.6, 0.1)), "ladder"),
])
def test_bad_ladders_raise(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_ladders_default_to_the_two_levels():
    assert PowerSGD(4, 1).levels == (4, 1) and PowerSGD(2).levels == (2, 2)
    assert PowerSGD(4, 1, ladder=[4, 2, 1]).levels == (4, 2, 1)
    assert TopK(0.5, 0.1, ladder=(0.5, 0.25, 0.1)).levels == (0.5, 0.25, 0.1)
    assert PowerSGD(2, 2, ladder=(2, 2)).levels == (2, 2)  # a static run states its one level


class Float64Tensors(Float64State, TorchTensorOps):
    """The torch tensor maths in fp64."""


class EightRanks(Collectives):
    """A world of 8 ranks, for the level costs; the tests that use it make no collective."""

    def size(self):
        return 8

    def rank(self):
        return 0


def float64_backends(collectives=EightRanks):
    tensors = Float64Tensors()
    return tensors, collectives(tensors)


SHAPES = [(6, 5), (5,), (12, 3, 2, 2), (40, 30)]


def random_deltas(seed=0):
    rng = np.random.RandomState(seed)
    return [torch.from_numpy(rng.standard_normal(shape)) for shape in SHAPES]


def test_powersgd_errors_are_one_power_iteration_from_q_as_numpy_computes_it():
    config = PowerSGD(4, 1, ladder=(4, 2, 1), min_compression_rate=0)
    reducer = PowerSGDReducer(SHAPES, config, *float64_backends())
    deltas = random_deltas()
    errors = reducer.approximation_errors(deltas, config.levels).numpy().reshape(len(reducer.compressed), 3)
    for row, layer in zip(errors, reducer.compressed):
        m = deltas[layer].numpy().reshape(SHAPES[layer][0], -1)
        q = reducer.q[layer].numpy()
        for error, rank in zip(row, config.levels):
            p = np.linalg.qr(m @ q[:, :rank])[0]
            expected = np.sum((m - p @ (p.T @ m)) ** 2)
            assert math.isclose(error, expected, rel_tol=1e-9), (layer, rank, error, expected)
        assert row[0] <= row[1] <= row[2]
    n_m = {layer: sum(reducer.matrices[layer]) for layer in reducer.compressed}
    assert reducer.level_costs(config.levels) == {
        layer: [4 * n_m[layer] * min(rank, *reducer.matrices[layer]) for rank in config.levels]
        for layer in reducer.compressed}


def test_topk_errors_are_what_the_kept_entries_leave_out_and_costs_follow_the_wire():
    config = TopK(0.5, 0.05, ladder=(0.5, 0.2, 0.05))
    reducer = TopKReducer(SHAPES, config, *float64_backends())
    deltas = random_deltas(1)
    errors = reducer.approximation_errors(deltas, config.levels).numpy().reshape(len(reducer.compressed), 3)
    for row, layer in zip(errors, reducer.compressed):
        squares = np.sort(deltas[layer].numpy().reshape(-1) ** 2)[::-1]
        for error, fraction in zip(row, config.levels):
            expected = squares[kept_count(fraction, squares.size):].sum()
            assert math.isclose(error, expected, rel_tol=1e-9), (layer, fraction, error, expected)
    # On 8 ranks, 1,200 entries go sparse below 8·4·1200 / (8·(4 + 2)) = 200 kept: 50 % and 20 %
    # travel dense (1,200 fp32), 5 % as 60 values and 60 int16 indices packed in 30 words, which
    # the allgather carries 7× on each link against the allreduce's 2·7/8×: 8/2 × the payload.
    costs = reducer.level_costs(config.levels)
    assert costs[3] == [4 * 1200, 4 * 1200, 4 * (60 + 30) * 8 / 2], costs[3]


def accordion_with(policy, collectives=EightRanks, **options):
    schedule = Accordion(["w", "b", "v"], (4, 2, 1), compressed_layers=[0, 2], policy=policy, **options)
    reducer = PowerSGDReducer([(20, 20), (20,), (60, 40)], PowerSGD(4, 1, ladder=(4, 2, 1), min_compression_rate=0),
                              *float64_backends(collectives))
    schedule.attach(reducer)
    return schedule, reducer


def exchange_of(schedule, reducer):
    params = [torch.zeros(shape, dtype=torch.float64) for shape in [(20, 20), (20,), (60, 40)]]
    return BucketedExchange(schedule, reducer, params)


def test_the_phase_schedule_reads_no_norms_and_ignores_decays():
    schedule, reducer = accordion_with(PhaseSchedule(total_windows=3))
    assert not schedule.window_accumulates and not schedule.window_is_check
    assert schedule.levels == [4, 4, 2] and [reducer.ranks[i].value for i in (0, 2)] == [4, 2]
    assert not schedule.observe_lr(1.0) and not schedule.observe_lr(0.01)
    assert schedule.levels == [4, 4, 2]
    exchange_of(schedule, reducer).end_window()
    assert schedule.levels == [2, 2, 1] and [reducer.ranks[i].value for i in (0, 2)] == [2, 1]
    assert schedule.log.checks[-1]["levels"] == {"w": 2, "v": 1}


def test_the_phase_schedule_logs_the_learning_rate_of_each_window():
    """Its levels ignore a decay, but its log must still plot the run's schedule."""
    exchange = exchange_of(*accordion_with(PhaseSchedule(total_windows=3)))
    exchange.observe_lr(0.1)
    exchange.end_window()
    exchange.observe_lr(0.01)  # a decay: no switch to ℓ_low, no decay record
    exchange.end_window()
    assert [(record["event"], record["lr"]) for record in exchange.accordion.log.checks] == \
        [("check", 0.1), ("check", 0.01)]


class TwoRanksOneDisagreeing(EightRanks):
    """The allgather of a world whose other rank holds other levels."""

    def start_allgather(self, flat, name):
        other = flat.clone()
        other[0] += 1
        return types.SimpleNamespace(wait=lambda: torch.stack([flat, other]))


def test_verify_levels_runs_at_every_decision_of_a_policy_that_reads_no_norms():
    schedule, reducer = accordion_with(PhaseSchedule(total_windows=3), collectives=TwoRanksOneDisagreeing,
                                       verify_levels=True)
    params = [torch.zeros(shape, dtype=torch.float64) for shape in [(20, 20), (20,), (60, 40)]]
    exchange = BucketedExchange(schedule, reducer, params)
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[1\].*layers that differ: \['w'\]"):
        exchange.end_window()


def test_the_policy_and_its_levels_are_checkpointed():
    schedule, _ = accordion_with(PhaseSchedule(total_windows=3))
    schedule.end_window()
    state = schedule.state_dict()
    resumed, _ = accordion_with(PhaseSchedule(total_windows=3))
    resumed.load_state_dict(state)
    assert resumed.levels == schedule.levels == [2, 2, 1]
    for other in (PhaseSchedule(total_windows=4), "error_budget", None):
        with pytest.raises(ValueError, match="policy"):
            accordion_with(other)[0].load_state_dict(state)
    # A checkpoint from before policies existed is Accordion's, its levels from its flags.
    old = dict(accordion_with(None)[0].state_dict())
    del old["policy"], old["current_levels"]
    plain, _ = accordion_with(None)
    plain.load_state_dict(old)
    assert plain.levels == [4, 4, 4]



class Resizable(EightRanks):
    """A world whose size an elastic reset changes."""
    world_size = 8

    def size(self):
        return self.world_size


def test_level_costs_follow_the_world_size_of_each_decision():
    """TopK's sparse-or-dense wire depends on the world size: after an elastic reset every rank,
    survivor or newcomer, must weigh the same costs, those of the new size."""
    tensors, world = float64_backends(Resizable)
    config = TopK(0.5, 0.05, ladder=(0.5, 0.2, 0.05))
    schedule = Accordion(["a", "b", "c", "d"], config.levels, compressed_layers=[0, 2, 3],
                         policy=PhaseSchedule(total_windows=3))
    reducer = TopKReducer(SHAPES, config, tensors, world)
    schedule.attach(reducer)
    assert schedule.level_costs[3][0] == 4 * 1200  # 50 % of 1,200 entries travels dense on 8 ranks
    world.world_size = 2
    assert schedule.level_costs == reducer.level_costs(config.levels) and schedule.level_costs[3][0] < 4 * 1200


def test_a_policy_that_reads_no_norms_keeps_no_delta():
    for policy, kept in ((PhaseSchedule(total_windows=3), 0), (None, 3), ("error_budget", 3)):
        assert len(exchange_of(*accordion_with(policy)).accumulated) == kept, policy


def test_the_plot_draws_the_levels_of_a_log_without_norms(tmp_path):
    """A phase schedule's checks log levels and no norms: no norm figure, and --layer says why."""
    from horovod_accordion.tools.plot import run_figures
    exchange = exchange_of(*accordion_with(PhaseSchedule(total_windows=3)))
    schedule = exchange.accordion
    for _ in range(3):
        exchange.end_window()
    log = tmp_path / "phase.jsonl"
    log.write_text("".join(json.dumps(record) + "\n" for record in schedule.log.checks))
    assert [pathlib.Path(p).name for p in run_figures(log, tmp_path / "out")] == ["levels.png"]
    with pytest.raises(ValueError, match="no norms"):
        run_figures(log, tmp_path / "out", layer="w")


class LoneRank(Collectives):
    """One rank, in fp32: every collective returns what this rank sent."""

    def size(self):
        return 1

    def rank(self):
        return 0

    def start_allreduce_mean(self, flat, name, compression=None):
        return types.SimpleNamespace(wait=lambda: flat)

    def _start_allgather(self, flat, name):
        return types.SimpleNamespace(wait=lambda: flat.view(1, -1))

    def _start_alltoall(self, rows, name):
        return types.SimpleNamespace(wait=lambda: rows)


LONE_SHAPES = [(20, 20), (20,), (60, 40)]


def lone_backends():
    tensors = TorchTensorOps()
    return tensors, LoneRank(tensors)


def run_steps(exchange, steps, seed=0):
    """``steps`` steps of gradients that only grow, each closing a window (``window_steps=1``)."""
    rng = np.random.RandomState(seed)
    for step in range(steps):
        grads = [torch.from_numpy(rng.standard_normal(shape)).float() * (1 + step) for shape in LONE_SHAPES]
        exchange.start(0, range(len(grads)), grads)
        exchange.finish()
        exchange.end_step()


def observe_over_steps(exchange, rates):
    """Each rate observed before a step, which carries it (``core.rates``), and the last one
    observed again, which decides on it."""
    for lr in rates:
        exchange.observe_lr(lr)
        run_steps(exchange, 1)
    exchange.observe_lr(rates[-1])


def lone_exchange(schedule, reducer):
    return BucketedExchange(schedule, reducer, [torch.zeros(shape) for shape in LONE_SHAPES])


@pytest.mark.parametrize("compression", [PowerSGD(4, min_compression_rate=0), TopK(0.1)])
def test_a_batch_switch_leaves_its_fixed_compression_at_its_level(compression):
    """The schedule's levels are micro-batch counts there. They reached the reducer as its level:
    PowerSGD ran at rank 1 or m, TopK at a fraction of 1.0 or m (an error)."""
    reducer, levels = make_reducer(compression, LONE_SHAPES, *lone_backends(), None)
    schedule = Accordion(["w", "b", "v"], window_steps=1, interval=1,
                         **schedule_arguments(BatchSwitch(8, 3), levels, reducer, 1, reducer.collectives))
    exchange = lone_exchange(schedule, reducer)

    def compression_levels():
        holders = reducer.ranks if isinstance(compression, PowerSGD) else reducer.fractions
        return {holder.value for holder in holders.values()}

    assert compression_levels() == {compression.levels[0]}
    run_steps(exchange, 6)
    assert 3 in schedule.levels  # the large batch was chosen: the switch happened
    observe_over_steps(exchange, [1.0, 0.1])  # a decay: back to the small batch
    assert schedule.levels[0] == 1
    assert compression_levels() == {compression.levels[0]}


class MyPolicy(AccordionPolicy):
    def decide(self, ladder, critical, window=0, current=None, errors=None, costs=None):
        return [ladder[-1]] * len(critical)


def test_a_policy_of_your_own_is_told_apart_from_accordions_and_refused_with_a_batch_switch():
    """It inherited the repr "AccordionPolicy()", by which checkpoints and the cross-rank check
    compare policies, and it passed with a batch switch, whose levels are no compression's."""
    assert repr(MyPolicy()) == "MyPolicy()" and repr(AccordionPolicy()) == "AccordionPolicy()"
    saved = accordion_with(None)[0].state_dict()
    with pytest.raises(ValueError, match="policy"):
        accordion_with(MyPolicy())[0].load_state_dict(saved)
    with pytest.raises(ValueError, match="batch_switch"):
        policy_for(MyPolicy(), (1, 3), batch_switch=True)


def test_a_restored_schedule_says_whether_its_window_adds_to_delta():
    """The flag that the step reads (a variable in a traced TF step) follows the loaded windows."""
    def exchange():
        schedule = Accordion(["w", "b", "v"], (4, 1), compressed_layers=[0, 2], window_steps=1, interval=3)
        return lone_exchange(schedule, PowerSGDReducer(LONE_SHAPES, PowerSGD(4, 1, min_compression_rate=0),
                                                      *lone_backends()))

    saved = exchange()
    run_steps(saved, 2)  # windows 0 and 1 closed: window 2 feeds no check
    assert saved.accumulating.value is False
    resumed = exchange()
    assert resumed.accumulating.value is True
    resumed.load_state_dict(saved.state_dict())
    assert resumed.accumulating.value is False


HADAMARD_SHAPES = [(16, 16), (16,), (64, 32)]
UNIT_ROUNDOFF_FP32 = 2.0 ** -24


def sylvester_hadamard(order):
    h = np.ones((1, 1))
    while len(h) < order:
        h = np.block([[h, h], [h, -h]])
    return h


def hadamard_gradients(steps):
    """Per step, gradients that bf16 and fp16 hold exactly and whose window sum fp32 holds exactly:
    multiples of 4 up to 256 in magnitude, on orthogonal (Hadamard) columns of distinct norms.
    Their squares (up to 2^18) overflow fp16's 65504."""
    grads = []
    for step in range(steps):
        layer = []
        for shape in HADAMARD_SHAPES:
            if len(shape) == 1:
                layer.append(np.full(shape, 4.0 * (step + 1)))
                continue
            rows, columns = shape
            scales = 4.0 * (1 + (np.arange(columns) * 7 + step) % 64)
            layer.append(sylvester_hadamard(rows)[:, :columns] * scales)
        grads.append(layer)
    return grads


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("compression", [PowerSGD(4, 1, ladder=(4, 2, 1), min_compression_rate=0),
                                         TopK(0.5, 0.05, ladder=(0.5, 0.2, 0.05))])
def test_the_error_table_of_half_precision_gradients_is_the_float64_one(dtype, compression):
    """bf16 and fp16 gradients of bf16 and fp16 parameters: Δ is kept in fp32 (exact here), the
    error table is computed in fp32 and squared in fp64, and the policy reads it, within a
    derived bound of the float64 table. TopK's residual is exact, so only fp32's sum of its n
    squares rounds: relative error ≤ (n + 3) u. PowerSGD's, with Q the first r unit columns and
    Δ's columns orthogonal: P = qr(Δ Q) has a backward error of O(m r u) (Householder), the
    products Δᵀ P and P (Δᵀ P)ᵀ add (m + r) u per entry, relative to ‖Δ‖, and the fp32 sum of the
    residual's m n squares adds m n u of ‖Δ‖²: within (m n + 2 (m r + m + n + r + 4)) u ‖Δ‖² (+ its
    square over ‖Δ‖²) of the float64 error."""
    steps = 2
    schedule = Accordion(["w", "b", "v"], compression.levels, compressed_layers=[0, 2], policy="error_budget",
                         interval=1, window_steps=steps)
    tensors, collectives = lone_backends()
    reducer, _ = make_reducer(compression, HADAMARD_SHAPES, tensors, collectives, None)
    if isinstance(compression, PowerSGD):
        for i in reducer.compressed:
            reducer.q[i].copy_(torch.eye(*reducer.q[i].shape))
    exchange = BucketedExchange(schedule, reducer, [torch.zeros(shape, dtype=dtype) for shape in HADAMARD_SHAPES])
    history = hadamard_gradients(steps)
    for grads in history:
        exchange.start(0, range(3), [torch.from_numpy(g).to(dtype) for g in grads])
        exchange.finish()
        exchange.end_step()
    assert [d.dtype for d in exchange.accumulated] == [torch.float32] * 3
    [check] = [c for c in schedule.log.checks if c.get("errors")]
    for name, layer in (("w", 0), ("v", 2)):
        delta = sum(grads[layer] for grads in history)  # float64, and exact
        m = delta.reshape(HADAMARD_SHAPES[layer][0], -1)
        for error, level in zip(check["errors"][name], compression.levels):
            if isinstance(compression, PowerSGD):
                p = m[:, :level] / np.linalg.norm(m[:, :level], axis=0)
                expected = np.sum((m - p @ (p.T @ m)) ** 2)
                rows, columns = m.shape
                slack = (rows * columns + 2 * (rows * level + rows + columns + level + 4)) * UNIT_ROUNDOFF_FP32 \
                    * np.sum(m ** 2)
                bound = slack + slack ** 2 / np.sum(m ** 2)
            else:
                squares = np.sort(m.reshape(-1) ** 2)[::-1]
                expected = squares[kept_count(level, squares.size):].sum()
                bound = (squares.size + 3) * UNIT_ROUNDOFF_FP32 * expected
            assert math.isfinite(error) and abs(error - expected) <= bound, (name, level, error, expected, bound)
