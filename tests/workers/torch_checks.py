"""Checks run on every rank of a real ``horovodrun -np 2`` job (see runner.py)."""
import json
import os
import tempfile

import torch
import horovod.torch as horovod

import horovod_accordion.torch as hvd
from horovod_accordion.torch import BatchSwitch, Compression, ErrorBudget, PhaseSchedule
from tests.workers.models import batch_of_rank, make_model
from tests.workers.policy_reference import assert_policy_checks, reference_costs, set_regime
from tests.workers.quantized_checks import two_shot_matches_the_float64_reference


def setup():
    hvd.init()
    torch.set_num_threads(1)
    return hvd.rank()


def gathered(tensor):
    """Every rank's copy of ``tensor``, shape (size, numel)."""
    return horovod.allgather(tensor.detach().reshape(1, -1).clone())


def assert_same_on_all_ranks(model):
    for name, p in model.named_parameters():
        rows = gathered(p)
        assert torch.equal(rows[0], rows[1]), f"{name} differs across ranks"


def rank_batch(step, scale=1.0):
    return batch_of_rank(hvd.rank(), step, scale)


def train(model, optimizer, steps, scale_at=None):
    for step in range(steps):
        x, y = rank_batch(step, scale=(10.0 if scale_at is not None and step >= scale_at else 1.0))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def set_rank_gradients(params, step):
    generator = torch.Generator().manual_seed(7919 * hvd.rank() + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator, dtype=p.dtype)


def expected_average(params):
    return [horovod.allreduce(p.grad.clone(), op=horovod.Average) for p in params]


def check_smoke_allreduce_and_allgather():
    summed = horovod.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=horovod.Sum)
    assert summed.item() == 3.0
    ragged = horovod.allgather(torch.full((hvd.rank() + 1, 2), float(hvd.rank())))
    assert ragged.shape == (3, 2) and ragged[0, 0] == 0 and ragged[1:, 0].tolist() == [1.0, 1.0]


def check_parameters_identical_after_one_step():
    for compression in (Compression.none, Compression.fp16, Compression.powersgd(2, 1),
                        Compression.topk(0.5, 0.1)):
        model = make_model()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters(),
                                             compression=compression)
        train(model, optimizer, 1)
        assert_same_on_all_ranks(model)


def check_none_matches_horovod_distributed_optimizer():
    ours, theirs = make_model(), make_model()
    ours_opt = hvd.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9),
                                        named_parameters=ours.named_parameters())
    theirs_opt = horovod.DistributedOptimizer(torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9),
                                              named_parameters=theirs.named_parameters())
    train(ours, ours_opt, 5)
    train(theirs, theirs_opt, 5)
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), f"{name}: max diff {(a - b).abs().max()}"


def check_powersgd_full_rank_with_error_feedback_equals_average():
    model = make_model()
    compression = Compression.powersgd(low_rank=64, min_compression_rate=0)  # clamped to min(n, m)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), compression=compression)
    params = list(model.parameters())
    assert len(optimizer._reducer.compressed) == 3
    for step in range(4):
        set_rank_gradients(params, step)
        expected = expected_average(params)
        optimizer.synchronize()
        for p, e in zip(params, expected):
            assert torch.allclose(p.grad, e, atol=1e-5, rtol=0), f"step {step}: {(p.grad - e).abs().max()}"
        optimizer.zero_grad()


def check_topk_full_fraction_equals_average():
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.topk(1.0))
    params = list(model.parameters())
    for step in range(3):
        set_rank_gradients(params, step)
        expected = expected_average(params)
        optimizer.synchronize()
        for p, e in zip(params, expected):
            assert torch.allclose(p.grad, e, atol=1e-6, rtol=0)
        optimizer.zero_grad()


def check_topk_averages_and_keeps_residual():
    p = torch.nn.Parameter(torch.zeros(2, 3))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), compression=Compression.topk(1 / 3))
    p.grad = torch.tensor([[1.0, -8.0, 2.0], [0.5, 0.0, 3.0]]) * (hvd.rank() + 1)
    optimizer.synchronize()
    # k = 2 per rank: -8 and 3 (x1 on rank 0, x2 on rank 1), averaged: -12 and 4.5
    assert p.grad.tolist() == [[0.0, -12.0, 0.0], [0.0, 0.0, 4.5]]
    residual = optimizer._reducer.residual[0].view(2, 3) / (hvd.rank() + 1)
    assert residual.tolist() == [[1.0, 0.0, 2.0], [0.5, 0.0, 0.0]]


def check_level_switch_on_every_rank_at_the_same_step_with_skewed_shards():
    model = make_model()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters(),
        compression=Compression.powersgd(2, 1, min_compression_rate=0), window_steps=1, interval=2)
    history, local_norms = [], []
    for step in range(12):
        x, y = rank_batch(0, scale=10.0 if step >= 6 else 1.0)  # rank 1's shard is 4x larger in scale
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        local_norms.append(model[0].weight.grad.norm().item())
        optimizer.step()
        history.append(list(optimizer.accordion_stats()["levels"].values()))
    everyone = horovod.allgather_object({"history": history, "norms": local_norms})
    assert everyone[0]["history"] == everyone[1]["history"], "ranks disagree on the levels"
    assert everyone[0]["norms"] != everyone[1]["norms"], "shards were meant to be skewed"
    first_layer = [levels[0] for levels in history]
    assert 1 in first_layer and first_layer.index(1) < 6, first_layer  # settled to ℓ_high
    assert first_layer[6] == 2 or first_layer[7] == 2, first_layer  # the jump at step 6 is critical
    assert optimizer._reducer.ranks[0].value == first_layer[-1]
    return first_layer


def split_over_two_devices():
    """A model whose second layer is on another device: ``meta`` stands in for a second GPU."""
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4, device="meta"))


def check_bad_configuration_raises_before_any_collective():
    model = make_model()
    cases = [
        lambda: Compression.powersgd(0),
        lambda: Compression.powersgd(1, 2),
        lambda: Compression.topk(0.0),
        lambda: Compression.topk(1.5),
        lambda: Compression.cast(torch.bfloat16),
        lambda: Compression.cast(torch.int8),
        lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), compression="topk"),
        lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), eta=-1.0),
        lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), interval=0),
        lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), window_steps=0),
        lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=horovod.Adasum),
        # Issue 18, R6: state on the first parameter's device; now refused, naming the devices.
        lambda: hvd.DistributedOptimizer(torch.optim.SGD(split_over_two_devices().parameters(), lr=0.1),
                                         compression=Compression.powersgd(1)),
    ]
    # Rank 1 alone makes the mistakes: had any of them entered a collective, rank 1
    # would hang waiting for rank 0, and this check would time out.
    if hvd.rank() == 1:
        for case in cases:
            try:
                case()
            except ValueError:
                continue
            raise AssertionError("a bad configuration did not raise ValueError")
    assert horovod.allreduce(torch.ones(1), op=horovod.Sum).item() == 2.0


def check_different_parameter_order_is_a_clear_error():
    model = make_model()
    named = list(model.named_parameters())
    if hvd.rank() == 1:
        named = named[::-1]
    try:
        hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=0.1), named_parameters=named)
    except ValueError as error:
        assert "registers its parameters differently" in str(error), error
        return str(error)
    raise AssertionError("a different parameter order was accepted")


def check_a_policy_that_differs_between_ranks_is_a_clear_error_on_every_rank():
    """Ranks with different policies would run different collectives at a check (an error
    table, or none) and hang there: every rank raises at construction instead."""
    model = make_model()
    policy = ErrorBudget(slack=2.0 if hvd.rank() == 0 else 3.0)
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                                 compression=Compression.powersgd(4, 1, ladder=(4, 2, 1)), policy=policy)
    except ValueError as error:
        assert ("uses policy ErrorBudget(slack=3.0), rank 0 uses ErrorBudget(slack=2.0)" if hvd.rank() == 1
                else "another compression or policy") in str(error), error
        return str(error)
    raise AssertionError("different policies were accepted")


class Mixed(torch.nn.Module):
    """A frozen layer, a branch only rank 0 uses, and fp64 and bf16 parameters."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.frozen = torch.nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.branch = torch.nn.Linear(8, 8)
        self.fp64 = torch.nn.Linear(8, 8).double()
        self.bf16 = torch.nn.Linear(8, 4).to(torch.bfloat16)

    def forward(self, x):
        h = self.frozen(x)
        if hvd.rank() == 0:
            h = h + self.branch(h)
        h = self.fp64(h.double()).float()
        return self.bf16(h.to(torch.bfloat16)).float()


def check_frozen_unused_and_mixed_dtype_parameters():
    for compression in (Compression.none, Compression.powersgd(2, 1, min_compression_rate=0),
                        Compression.topk(0.5)):
        model = Mixed()
        frozen_before = model.frozen.weight.clone()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters(), compression=compression)
        for step in range(3):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(hvd.rank() * 10 + step))
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()
        assert torch.equal(model.frozen.weight, frozen_before)
        assert model.fp64.weight.dtype == torch.float64 and model.bf16.weight.dtype == torch.bfloat16
        for name, p in model.named_parameters():
            rows = gathered(p.float())
            assert torch.equal(rows[0], rows[1]), f"{compression}: {name} differs across ranks"
        assert not torch.equal(model.branch.weight, Mixed().branch.weight), "rank 0's branch gradient was lost"


def check_bytes_on_the_wire():
    layer = torch.nn.Linear(64, 32)  # weight 32x64, bias 32
    expected = {
        "none": (32 * 64 + 32) * 4,
        "fp16": (32 * 64 + 32) * 2,
        "powersgd-1": (32 * 1 + 64 * 1 + 32) * 4,
        "powersgd-2": (32 * 2 + 64 * 2 + 32) * 4,
        "topk-10%": (204 + 204 // 2) * 4 + 32 * 4,  # 204 fp32 values, 204 int16 indices, the dense bias
        # 2048 + 128 values (the bias padded to a block for each of the 2 ranks), 4 bits each and an
        # fp32 scale per 64: all of it handed to the all-to-all, one rank's half to the all-gather.
        "quantized-4": (2176 // 2 + 4 * 34) * 3 // 2,
    }
    compressions = {"none": Compression.none, "fp16": Compression.fp16, "powersgd-1": Compression.powersgd(1),
                    "powersgd-2": Compression.powersgd(2), "topk-10%": Compression.topk(0.1),
                    "quantized-4": Compression.quantized(4)}
    measured = {}
    for key, compression in compressions.items():
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.0), compression=compression)
        layer(torch.randn(3, 64)).sum().backward()
        optimizer.step()
        measured[key] = optimizer.accordion_stats()["bytes_per_step"][-1]
        optimizer.zero_grad()
    assert measured == expected, measured
    return measured


def check_state_dict_round_trip_continues_identically():
    for compression in (Compression.powersgd(2, 1, min_compression_rate=0), Compression.quantized(8, 4)):
        state_dict_round_trip_continues_identically(compression)


def state_dict_round_trip_continues_identically(compression):
    def build():
        model = make_model()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                             named_parameters=model.named_parameters(), compression=compression,
                                             window_steps=2, interval=1)
        return model, optimizer

    model, optimizer = build()
    train(model, optimizer, 5)
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    buffer = tempfile.SpooledTemporaryFile()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    restored_model, restored = build()
    restored_model.load_state_dict(saved_model)
    restored.load_state_dict(torch.load(buffer, weights_only=False))
    assert restored.accordion_stats()["levels"] == optimizer.accordion_stats()["levels"]
    assert compression_state(restored).keys() == compression_state(optimizer).keys()
    assert all(torch.equal(restored_tensor, compression_state(optimizer)[key])
               for key, restored_tensor in compression_state(restored).items())
    for step in range(5, 9):
        for m, o in ((model, optimizer), (restored_model, restored)):
            x, y = rank_batch(step)
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            o.step()
    for (name, a), b in zip(model.named_parameters(), restored_model.parameters()):
        assert torch.equal(a, b), f"{name} diverged after restoring the checkpoint ({compression})"


def check_jsonl_log_on_rank_zero_only():
    path = os.path.join(tempfile.mkdtemp(prefix="accordion-log-"), "log.jsonl")
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.topk(0.5, 0.1), log_path=path)
    train(model, optimizer, 2)
    optimizer.end_epoch()
    if hvd.rank() != 0:
        assert not os.path.exists(path)
        return None
    records = [json.loads(line) for line in open(path)]
    assert [r["event"] for r in records] == ["step", "step", "check"]
    # The compressed matrices only: the biases, never compressed, have no level (issue 18: they were listed).
    assert records[-1]["levels"] == {name: 0.5 for name, p in model.named_parameters() if p.dim() > 1}
    assert records[0]["bytes_sent"] == optimizer.accordion_stats()["bytes_per_step"][0]
    return records[-1]


POLICY_RUNS = [(policy, compression) for policy in (ErrorBudget(slack=2.0), PhaseSchedule(total_windows=5))
               for compression in (Compression.powersgd(4, 1, ladder=(4, 2, 1), min_compression_rate=0),
                                   Compression.topk(0.5, 0.05, ladder=(0.5, 0.2, 0.05)))]


def check_level_policies_decide_as_the_reference_on_every_rank():
    """Issue 21: the error budget and the phase schedule choose from the ladder; every rank
    takes the same levels at every step, and each check is the reference's decision, from
    the error table it logged (averaged over ranks) and the layers' costs from their shapes."""
    middles = []
    for policy, compression in POLICY_RUNS:
        model = make_model()
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters(),
            compression=compression, window_steps=2, interval=1, lr_decay_factor=None, policy=policy)
        history = [optimizer.accordion_stats()["levels"]]
        for step in range(10):
            train_step(model, optimizer, step, scale=10.0 if step >= 6 else 1.0)
            history.append(optimizer.accordion_stats()["levels"])
        everyone = horovod.allgather_object(history)
        assert everyone[0] == everyone[1], f"{policy!r}, {compression!r}: the ranks' levels differ"
        costs = reference_costs([(n, p.shape) for n, p in model.named_parameters()], compression, hvd.size())
        middles.append(assert_policy_checks(policy, optimizer.accordion_stats()["checks"], compression.levels,
                                            costs, history[0]))
        reducer_levels = optimizer._reducer.ranks if hasattr(compression, "low_rank") else optimizer._reducer.fractions
        assert [reducer_levels[k].value for k in sorted(reducer_levels)] == list(history[-1].values())
    # Each PowerSGD run and the phase schedule use the middle rank at some check (TopK's error
    # budget may not: on 2 ranks 20 % of these small layers costs about what 50 % does).
    assert middles[0] and middles[2] and middles[3], f"checks that used a middle level, per run: {middles}"
    return middles


def train_step(model, optimizer, step, scale=1.0):
    x, y = rank_batch(step, scale=scale)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def batch_switch_optimizer(model, lr, switch, **kwargs):
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                    named_parameters=model.named_parameters(), batch_switch=switch, **kwargs)


def check_batch_switch_accumulated_micro_batches_equal_one_large_step():
    switch = BatchSwitch(small_batch=8, multiplier=4, warmup_steps=0)
    accumulated, large = make_model(), make_model()
    optimizer = batch_switch_optimizer(accumulated, 0.1, switch)
    set_regime(optimizer._accordion, [False] * len(optimizer._params))  # the large-batch regime
    reference = hvd.DistributedOptimizer(torch.optim.SGD(large.parameters(), lr=0.1 * 4),  # linear scaling
                                         named_parameters=large.named_parameters())
    x, y = rank_batch(0, scale=1.0)
    x, y = torch.cat([x, x]), torch.cat([y, y])  # 32 samples
    for micro in range(4):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(accumulated(x[8 * micro:8 * micro + 8]),
                                          y[8 * micro:8 * micro + 8]).backward()
        optimizer.step()
        assert optimizer.accordion_stats()["steps"] == (1 if micro == 3 else 0)
    reference.zero_grad()
    torch.nn.functional.cross_entropy(large(x), y).backward()
    reference.step()
    for (name, a), b in zip(accumulated.named_parameters(), large.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), f"{name}: {(a - b).abs().max()}"


def check_batch_switch_traffic_lr_and_agreement_follow_the_controller():
    switch = BatchSwitch(small_batch=8, multiplier=4, warmup_steps=2)
    model = make_model()
    optimizer = batch_switch_optimizer(model, 0.01, switch, interval=1)
    x, y = rank_batch(0)
    bytes_per_epoch, lr_used = [], []
    for epoch in range(4):
        if epoch == 3:
            for group in optimizer.param_groups:
                group["lr"] = 0.001  # a step decay: back to the small batch
        sent_before = optimizer.accordion_stats()["total_bytes_sent"]
        for micro in range(16):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x[:8]), y[:8]).backward()
            before = model[0].weight.detach().clone()
            optimizer.step()
            if micro % optimizer.micro_batches_per_step == optimizer.micro_batches_per_step - 1:
                grad = model[0].weight.grad
                mask = grad.abs() > 1e-4
                lr_used.append(round(((before - model[0].weight.detach())[mask] / grad[mask]).median().item(), 6))
        bytes_per_epoch.append(optimizer.accordion_stats()["total_bytes_sent"] - sent_before)
        optimizer.end_epoch()
    stats = optimizer.accordion_stats()
    micro_batches = [extra["micro_batches"] for extra in stats["steps_extra"]]
    # epochs 0-1: small batch (the first checks), 2: large with LR warm-up, 3: the large batch that
    # carries the decayed rate (``core.rates``), then small after the decay
    assert micro_batches == [1] * 32 + [4] * 5 + [1] * 12, micro_batches
    assert lr_used == [0.01] * 32 + [0.02, 0.03, 0.04, 0.04, 0.004] + [0.001] * 12, lr_used
    small, large = bytes_per_epoch[1], bytes_per_epoch[2]
    assert large * 4 == small, bytes_per_epoch
    decays = [c for c in stats["checks"] if c["event"] == "lr_decay"]
    assert len(decays) == 1 and decays[0]["step"] == 37, decays
    checks = [c for c in stats["checks"] if c["event"] == "check"]
    assert [c["micro_batches_per_step"] for c in checks] == [1, 4, 4, 4], checks
    assert [c["global_batch"] for c in checks] == [16, 64, 64, 64], checks
    everyone = horovod.allgather_object({"micro": micro_batches, "checks": checks})
    assert everyone[0] == everyone[1], "ranks disagree on the batch size"
    return {"bytes_per_epoch": bytes_per_epoch, "global_batch": [c["global_batch"] for c in checks]}


def check_batch_switch_keeps_a_fixed_compression_at_its_level():
    """The schedule's levels are micro-batches per step: they reached a fixed PowerSGD as its
    rank (1 or m) and a fixed TopK as its fraction (1.0, or m, where topk raises)."""
    x, y = rank_batch(0)
    large_steps = {}
    for name, compression in (("powersgd", Compression.powersgd(2)), ("topk", Compression.topk(0.1))):
        model = make_model()
        optimizer = batch_switch_optimizer(model, 0.01, BatchSwitch(small_batch=8, multiplier=4),
                                           compression=compression, interval=1)
        for epoch in range(3):
            for micro in range(8):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x[:8]), y[:8]).backward()
                optimizer.step()
            optimizer.end_epoch()
        micro_batches = [extra["micro_batches"] for extra in optimizer.accordion_stats()["steps_extra"]]
        large_steps[name] = micro_batches.count(4)
        assert large_steps[name] > 0, micro_batches  # the large batch ran
        holders = optimizer._reducer.ranks if name == "powersgd" else optimizer._reducer.fractions
        assert holders and {holder.value for holder in holders.values()} == {compression.levels[0]}, name
    return large_steps


def check_powersgd_computes_p_and_q_into_buffers_kept_across_steps():
    """As torch's hook: M Q and Mᵀ P are written into each bucket's P and Q buffers, which the
    allreduce reads whole (no ``cat``) and which later steps reuse. The average handed to a
    parameter that had no gradient is a tensor of its own, not a view of a buffer that the next
    step overwrites."""
    model = make_model()
    unused = torch.nn.Parameter(torch.zeros(7))
    named = list(model.named_parameters()) + [("unused", unused)]
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=0.1), named_parameters=named,
                                         compression=Compression.powersgd(2, min_compression_rate=0))
    train(model, optimizer, 1)
    buffers = optimizer._tensors._buffers
    first = {name: buffer.data_ptr() for name, buffer in buffers.items()}
    assert sorted(first) == ["P.b0", "Q.b0"], sorted(first)
    storages = {buffer.untyped_storage().data_ptr() for buffer in buffers.values()}
    assert unused.grad is not None and unused.grad.untyped_storage().data_ptr() not in storages
    with torch.profiler.profile() as profile:
        train(model, optimizer, 2)
    cats = [event.name for event in profile.events() if event.name == "aten::cat"]
    assert not cats, f"{len(cats)} cat calls in 2 steps"
    assert {name: buffer.data_ptr() for name, buffer in buffers.items()} == first
    return {name: buffer.numel() for name, buffer in buffers.items()}


def check_set_backward_passes_per_step_counts_that_many_micro_batches_per_step():
    """Horovod's setter. The detector divides Δ's norms by the micro-batches in it: the step
    driver kept the count the optimizer was built with, 1, so the norms came out 2x too large."""
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1, min_compression_rate=0))
    optimizer.set_backward_passes_per_step(2)
    for step in range(3):
        optimizer.zero_grad()
        for micro_batch in range(2):
            x, y = rank_batch(2 * step + micro_batch)
            torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    assert optimizer._accordion.micro_batches_accumulated == 6, optimizer._accordion.micro_batches_accumulated
    optimizer.end_epoch()
    return optimizer.accordion_stats()["checks"][-1]["norms"]


EVERY_COMPRESSION = {
    "none": Compression.none, "fp16": Compression.fp16,
    "powersgd static": Compression.powersgd(2), "powersgd adaptive": Compression.powersgd(2, 1),
    "topk static": Compression.topk(0.1), "topk adaptive": Compression.topk(0.5, 0.1),
    "quantized static": Compression.quantized(4), "quantized adaptive": Compression.quantized(8, 4),
}


def check_every_compression_closes_windows_by_epoch_and_by_steps():
    """A user's loop must not change when they switch compression: the baselines close
    windows too, as no-ops, and only the adaptive kinds record checks."""
    for label, compression in EVERY_COMPRESSION.items():
        for window_steps in (None, 2):
            model = make_model()
            optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                 named_parameters=model.named_parameters(),
                                                 compression=compression, interval=1, window_steps=window_steps)
            for epoch in range(3):
                train(model, optimizer, 4)
                if window_steps is None:
                    optimizer.end_epoch()
            assert_same_on_all_ranks(model)
            checks = [c for c in optimizer.accordion_stats()["checks"] if c["event"] == "check"]
            adaptive = "adaptive" in label
            assert len(checks) == ((3 if window_steps is None else 6) if adaptive else 0), (label, window_steps)


def tensorboard_scalars(logdir):
    """Every scalar under ``logdir``, read back with TensorBoard's own event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(logdir)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def check_tensorboard_scalars_on_rank_zero_only():
    # A new directory: the reader reads every event file in it, a stale run's too.
    logdir = os.path.join(tempfile.mkdtemp(prefix="accordion-tb-"), "logs")
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1, min_compression_rate=0),
                                         interval=1, tensorboard_dir=logdir)
    for epoch in range(2):
        train(model, optimizer, 3)
        optimizer.end_epoch()
    if hvd.rank() != 0:
        assert not os.path.exists(logdir)
        return None
    scalars = tensorboard_scalars(logdir)
    stats = optimizer.accordion_stats()
    assert [v for _, v in scalars["accordion/bytes_per_step"]] == stats["bytes_per_step"]
    assert [s for s, _ in scalars["accordion/bytes_per_step"]] == list(range(1, 7))
    assert [v for _, v in scalars["accordion/wire_bytes_per_step"]] == stats["wire_bytes_per_step"]
    for name in stats["levels"]:
        assert [v for _, v in scalars[f"accordion/level/{name}"]] == [c["levels"][name] for c in stats["checks"]]
    # the first check has no ratio (nothing to compare with); the second has one per layer
    second = stats["checks"][1]["ratios"]
    assert [v for _, v in scalars["accordion/ratio/0.weight"]] == [pytest_approx(second["0.weight"])]
    return sorted(scalars)


def pytest_approx(value):
    import pytest
    return pytest.approx(value, rel=1e-6)


def check_longer_delta_and_averaged_norm_measure_what_they_say():
    """delta_windows=2: Δ sums the two windows before each check; check_norm="averaged": the
    norm of the Δ averaged over ranks, not the mean of the ranks' own squared norms."""
    compression = Compression.powersgd(2, 1, min_compression_rate=0)
    for delta_windows, check_norm in ((2, "local"), (1, "averaged"), (2, "averaged")):
        model = make_model()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                             named_parameters=model.named_parameters(), compression=compression,
                                             interval=2, delta_windows=delta_windows, check_norm=check_norm)
        params = list(model.parameters())
        sums = [torch.zeros_like(p, dtype=torch.float64) for p in params]
        expected_checks = []
        for window in range(5):  # windows 0, 2 and 4 end in checks
            for step in range(3):
                set_rank_gradients(params, 10 * window + step)
                accumulates = window % 2 == 0 or delta_windows == 2
                if accumulates:
                    for total, p in zip(sums, params):
                        total += p.grad.double()
                optimizer.step()
            if window % 2 == 0:
                micro_batches = 3 * (1 if window == 0 else delta_windows)
                if check_norm == "averaged":
                    squared = [horovod.allreduce(s, op=horovod.Average).pow(2).sum() for s in sums]
                else:
                    squared = [horovod.allreduce(s.pow(2).sum(), op=horovod.Average) for s in sums]
                expected_checks.append([float(q.sqrt()) / micro_batches for q in squared])
                sums = [torch.zeros_like(s) for s in sums]
            optimizer.end_epoch()
        checks = [c for c in optimizer.accordion_stats()["checks"] if c["event"] == "check"]
        assert len(checks) == 3
        for check, expected in zip(checks, expected_checks):
            got = list(check["norms"].values())
            assert got == [pytest_approx(e) for e in expected], (delta_windows, check_norm, got, expected)


def compression_state(optimizer):
    """Each state tensor of the reducer (memory, Q, residual), copied, by (group, layer)."""
    return {(group, i): t.clone() for group, entries in optimizer._reducer.state().items()
            for i, t in entries.items() if isinstance(t, torch.Tensor)}


def check_a_non_finite_gradient_leaves_that_layers_state_and_delta_clean():
    """One inf on rank 1 at step 1: that step's average is non-finite (so a scaler skips it),
    the layer's memory, Q or residual stay as they were, the other layers move on, Δ leaves
    the step out, and every later step is finite again."""
    for compression in (Compression.powersgd(2, 1, min_compression_rate=0), Compression.topk(0.5, 0.1),
                        Compression.quantized(8, 4)):
        model = make_model()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                             named_parameters=model.named_parameters(), compression=compression)
        params = list(model.parameters())
        finite, delta = [], torch.zeros_like(params[0])
        for step in range(4):
            set_rank_gradients(params, step)
            if step == 1 and hvd.rank() == 1:
                params[0].grad[0, 0] = float("inf")
            else:
                delta += params[0].grad
            before = compression_state(optimizer)
            optimizer.synchronize()
            finite.append([bool(torch.isfinite(p.grad).all()) for p in params])
            after = compression_state(optimizer)
            if step == 1:
                for (group, layer), tensor in after.items():
                    if layer == 0:
                        assert torch.equal(tensor, before[(group, layer)]), (compression, group)
                assert any(not torch.equal(t, before[key]) for key, t in after.items() if key[1] != 0), compression
            optimizer.zero_grad()
            optimizer._synchronized = False  # synchronize() without step(): nothing is applied here
        assert finite[1][0] is False and all(finite[1][1:]) and all(all(f) for f in finite[:1] + finite[2:]), finite
        assert torch.isfinite(optimizer._exchange.accumulated[0]).all()
        assert torch.allclose(optimizer._exchange.accumulated[0], delta, atol=1e-6, rtol=0)


def check_amp_recipe_with_grad_scaler_skips_the_overflow_on_both_ranks():
    """Horovod's AMP recipe (synchronize, unscale_, skip_synchronize, step) with an overflow on
    one rank only: both ranks skip that step and train on to the same parameters."""
    for compression in (Compression.powersgd(2, 1, min_compression_rate=0), Compression.topk(0.5, 0.1),
                        Compression.quantized(8, 4)):
        model = make_model()
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                             named_parameters=model.named_parameters(), compression=compression,
                                             grad_scaler=scaler)
        snapshots = []
        for step in range(5):
            x, y = rank_batch(step)
            optimizer.zero_grad()
            # The overflow happens inside backward, where the buckets start, as under autocast.
            overflow = model[0].weight.register_hook(lambda g: g.index_fill(1, torch.tensor([0]), float("inf"))) \
                if step == 2 and hvd.rank() == 1 else None
            scaler.scale(torch.nn.functional.cross_entropy(model(x), y)).backward()
            if overflow is not None:
                overflow.remove()
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
            scaler.update()
            snapshots.append([p.detach().clone() for p in model.parameters()])
            assert all(torch.isfinite(p).all() for p in model.parameters()), (compression, step)
        assert scaler.get_scale() == 2.0 ** 7  # halved once, for the one skipped step
        assert all(torch.equal(a, b) for a, b in zip(snapshots[1], snapshots[2])), "step 2 was applied"
        assert not torch.equal(snapshots[3][0], snapshots[2][0]) and not torch.equal(snapshots[4][0], snapshots[3][0])
        assert_same_on_all_ranks(model)


def check_end_epoch_before_any_step_warns_and_closes_no_window():
    """As on the hook states: before the first step there is no window to close. It closed an
    empty one silently."""
    import warnings

    from horovod_accordion.core.exchange import END_EPOCH_BEFORE_ANY_STEP

    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), interval=1,
                                         compression=Compression.powersgd(2, 1, min_compression_rate=0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimizer.end_epoch()
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == [END_EPOCH_BEFORE_ANY_STEP]
    assert optimizer._accordion.detector.windows_seen == 0


def check_quantized_two_shot_matches_the_float64_reference():
    """Through Horovod's alltoall and allgather (``tests/workers/quantized_checks.py``)."""
    from horovod_accordion.torch.ops import TorchCollectives
    from horovod_accordion.torch_common.tensors import TorchTensorOps
    return two_shot_matches_the_float64_reference(TorchCollectives(TorchTensorOps(), hvd.global_process_set))
