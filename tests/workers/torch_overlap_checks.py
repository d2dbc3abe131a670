"""Buckets started from backward (the overlapped path) against everything reduced in
``synchronize()``, on every rank of a real ``horovodrun -np 2`` job."""
import torch

import horovod_accordion.torch as hvd
from horovod_accordion.torch import Compression
from tests.workers.torch_checks import assert_same_on_all_ranks, make_model, rank_batch, setup  # noqa: F401

COMPRESSIONS = {
    "none": lambda: Compression.none,
    "fp16": lambda: Compression.fp16,
    "powersgd 2/1": lambda: Compression.powersgd(2, 1, min_compression_rate=0),
    "topk 0.5/0.1": lambda: Compression.topk(0.5, 0.1),
}


def train(compression, overlapped, passes, steps=12):
    """Windows of 2 steps with a check each, inputs ×10 from step 6 (so levels switch), and
    ``passes`` backward passes per step. ``overlapped``: every layer its own bucket, started
    from backward's hooks; otherwise the gradients are set by hand, so no hook fires and one
    bucket of everything is reduced in ``synchronize()``, as before buckets existed."""
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                         named_parameters=model.named_parameters(), compression=compression,
                                         backward_passes_per_step=passes, window_steps=2, interval=1,
                                         bucket_cap_mb=1e-6 if overlapped else None)
    started_in_backward = []
    for step in range(steps):
        optimizer.zero_grad()
        for micro in range(passes):
            x, y = rank_batch(passes * step + micro, scale=10.0 if step >= 6 else 1.0)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if overlapped:
                loss.backward()
            else:
                for p, grad in zip(model.parameters(), torch.autograd.grad(loss, list(model.parameters()))):
                    p.grad = grad if p.grad is None else p.grad + grad
        started_in_backward.append(len(optimizer._exchange.started))
        optimizer.step()
    return model, optimizer, started_in_backward


def check_overlapped_buckets_give_the_parameters_of_one_synchronize():
    """Every compression, with 1 and 2 backward passes per step: the same parameters, levels
    and bytes, bitwise, whichever way the gradients are reduced."""
    report = {}
    for name, compression in COMPRESSIONS.items():
        for passes in (1, 2):
            model, optimizer, started = train(compression(), overlapped=True, passes=passes)
            reference, reference_optimizer, reference_started = train(compression(), overlapped=False, passes=passes)
            assert started == [len(optimizer._buckets)] * len(started) == [6] * len(started), (name, started)
            assert reference_started == [0] * len(started), (name, reference_started)
            for (layer, p), q in zip(model.named_parameters(), reference.parameters()):
                assert torch.equal(p, q), f"{name}, {passes} passes, {layer}: max diff {(p - q).abs().max():.3e}"
            stats, reference_stats = optimizer.accordion_stats(), reference_optimizer.accordion_stats()
            assert [c["levels"] for c in stats["checks"]] == [c["levels"] for c in reference_stats["checks"]], name
            assert stats["bytes_per_step"] == reference_stats["bytes_per_step"], name
            assert_same_on_all_ranks(model)
            report[f"{name}, {passes} passes"] = sorted({str(v) for c in stats["checks"] for v in c["levels"].values()})
    return report


def check_a_bucket_is_on_the_wire_before_backward_reaches_the_first_layer():
    """The first bucket (the last layer) starts while backward still computes the first layer's
    gradient, as Horovod's and DDP's allreduces do."""
    for name, compression in COMPRESSIONS.items():
        model = make_model()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                             named_parameters=model.named_parameters(),
                                             compression=compression(), bucket_cap_mb=1e-6)
        seen = []
        model[0].weight.register_hook(lambda grad: seen.append(len(optimizer._exchange.started)))
        x, y = rank_batch(0)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        # 6 buckets: all but the first layer's weight (and perhaps its bias) are on the wire.
        assert len(seen) == 1 and seen[0] in (4, 5), (name, seen)


def check_a_learning_rate_drop_between_backward_and_step_counts_from_the_next_step():
    """Buckets already on the wire keep the levels they started with (before, the switch came
    mid-step, between P and Q): the drop set between backward and step is the next step's rate,
    which that step carries (``core.rates``), and the step after it switches every layer to ℓ_low
    at its first bucket."""
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1, min_compression_rate=0),
                                         window_steps=1, interval=1, bucket_cap_mb=1e-6)
    x, y = rank_batch(0)  # the same batch every step: the norms settle and the layers go to ℓ_high
    for _ in range(6):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    before = optimizer.accordion_stats()["levels"]
    assert 1 in before.values(), before
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for group in optimizer.param_groups:
        group["lr"] = 0.001
    optimizer.step()
    assert decays(optimizer) == 0
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()  # carries the new rate
    optimizer.step()
    assert decays(optimizer) == 0
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert decays(optimizer) == 1  # decided at this step's first bucket
    assert set(optimizer.accordion_stats()["levels"].values()) == {2}
    optimizer.step()
    assert_same_on_all_ranks(model)
    return before


def decays(optimizer):
    return sum(check.get("event") == "lr_decay" for check in optimizer.accordion_stats()["checks"])


def check_misuse_of_the_started_buckets_is_a_clear_error():
    """As in Horovod: a second backward with backward_passes_per_step=1, or zero_grad()
    between backward and step, raise; synchronize() then still completes the started buckets."""
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1, min_compression_rate=0))
    x, y = rank_batch(0)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    try:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        raise AssertionError("a second backward did not raise")
    except AssertionError as error:
        assert "more than backward_passes_per_step" in str(error), error
    try:
        optimizer.zero_grad()
        raise AssertionError("zero_grad() did not raise")
    except AssertionError as error:
        assert "zero_grad() was called after loss.backward()" in str(error), error
    optimizer.synchronize()
    with optimizer.skip_synchronize():
        optimizer.step()
    optimizer.zero_grad()
    assert_same_on_all_ranks(model)
