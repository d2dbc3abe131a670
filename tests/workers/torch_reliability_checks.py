"""Reliability checks on 2 real ranks: broadcast and resume, misuse, bad inputs, and the
reducers against independent numpy references (see runner.py).

Both ranks run in their own single-rank process sets too, so a collective that escaped
its process set would hang or mix the ranks' data here.
"""
import gc
import time
import warnings

import numpy as np
import torch
import horovod.torch as horovod

import horovod_accordion.torch as hvd
from horovod_accordion.core.reducers import initial_query
from horovod_accordion.torch import BatchSwitch, Compression
from tests.workers.policy_reference import set_regime
from tests.workers.torch_checks import gathered, make_model, rank_batch, set_rank_gradients, train

SINGLE_RANK_SETS = []


def setup():
    SINGLE_RANK_SETS.extend([horovod.ProcessSet([0]), horovod.ProcessSet([1])])
    hvd.init(process_sets=SINGLE_RANK_SETS)
    torch.set_num_threads(1)
    return hvd.rank()


def wrap(model, compression, **kwargs):
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                    named_parameters=model.named_parameters(), compression=compression, **kwargs)


def shared_state(optimizer):
    """What every rank must hold alike after a broadcast."""
    state = optimizer.state_dict()["accordion"]
    return {"schedule": state["schedule"], "q": {i: q.clone() for i, q in state["reducer"]["q"].items()},
            "ranks": state["reducer"]["ranks"], "levels": optimizer.accordion_stats()["levels"]}


def assert_rows_equal(tensor, what):
    rows = gathered(tensor.float())
    assert torch.equal(rows[0], rows[1]), f"{what} differs across ranks"


def check_broadcast_on_a_fresh_optimizer_takes_no_step():
    model = make_model()
    optimizer = wrap(model, Compression.powersgd(2, 1))
    q_before = {i: q.clone() for i, q in optimizer._reducer.q.items()}
    weights_before = [p.clone() for p in model.parameters()]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert optimizer._accordion.step == 0, optimizer._accordion.step
    for i, q in optimizer._reducer.q.items():
        assert torch.equal(q, q_before[i]), f"Q of layer {i} changed: norm {q_before[i].norm()} -> {q.norm()}"
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), weights_before))
    # Horovod's initialisation (issue 34): the wrapped optimizer's state exists, from zero gradients.
    buffers = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    assert all(not buffer.any() for buffer in buffers), "the state was made from other than zero gradients"
    return {i: float(q.norm()) for i, q in q_before.items()}


def check_rank_zero_checkpoint_then_broadcast_shares_state_and_keeps_memory_per_rank():
    compression = Compression.powersgd(2, 1, min_compression_rate=0)
    options = dict(window_steps=2, interval=2)
    model = make_model()
    optimizer = wrap(model, compression, **options)
    train(model, optimizer, 9)
    saved_model, saved_optimizer = model.state_dict(), optimizer.state_dict()
    assert saved_optimizer["accordion"]["schedule"]["detector"]["windows_seen"] == 4

    resumed = make_model(seed=1)
    resumed_optimizer = wrap(resumed, compression, **options)
    if hvd.rank() == 0:  # the usual resume: only rank 0 reads the file
        resumed.load_state_dict(saved_model)
        resumed_optimizer.load_state_dict(saved_optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the broadcast path warns about nothing
        hvd.broadcast_parameters(resumed.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(resumed_optimizer, root_rank=0)
    state = shared_state(resumed_optimizer)
    for i, q in state["q"].items():
        assert_rows_equal(q, f"Q {i}")
    rows = horovod.allgather_object(state["schedule"])
    assert rows[0] == rows[1], rows
    assert rows[0]["step"] == 9
    assert horovod.allgather_object(state["levels"]) == [shared_state(optimizer)["levels"]] * 2
    momentum = [s["momentum_buffer"] for s in resumed_optimizer.state_dict()["state"].values()]
    assert len(momentum) == 6
    for buffer in momentum:
        assert_rows_equal(buffer, "momentum")
    memory = resumed_optimizer._reducer.memory
    if hvd.rank() == 0:
        for i, m in memory.items():
            assert torch.equal(m, optimizer._reducer.memory[i]), f"rank 0 lost its memory {i}"
    else:
        assert all(float(m.abs().max()) == 0 for m in memory.values()), "rank 1 took rank 0's memory"
    train(resumed, resumed_optimizer, 3)
    for name, p in resumed.named_parameters():
        assert_rows_equal(p, name)


def check_loading_another_ranks_state_dict_resets_its_per_rank_part_with_a_warning():
    compression = Compression.topk(0.5, 0.1)
    model = make_model()
    optimizer = wrap(model, compression)
    train(model, optimizer, 3)
    rows = horovod.allgather_object(optimizer.state_dict())
    fresh = wrap(make_model(), compression)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fresh.load_state_dict(rows[0])  # every rank loads rank 0's file
    messages = [str(w.message) for w in caught if "restarts from zero" in str(w.message)]
    if hvd.rank() == 0:
        assert not messages, messages
        assert all(torch.equal(a, b) for a, b in zip(fresh._reducer.residual.values(),
                                                     optimizer._reducer.residual.values()))
    else:
        assert len(messages) == 1 and "rank 0's of 2, not this rank's (1 of 2)" in messages[0], messages
        assert all(float(r.abs().max()) == 0 for r in fresh._reducer.residual.values())
    return messages


def check_checkpoint_from_another_model_or_compression_is_a_clear_error():
    model = make_model()
    optimizer = wrap(model, Compression.powersgd(2, 1))
    saved = optimizer.state_dict()
    errors = {}
    others = {
        "levels": lambda: wrap(make_model(), Compression.powersgd(4, 1)),
        "compression": lambda: wrap(make_model(), Compression.topk(2 / 3, 1 / 3)),
        "model": lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(torch.nn.Linear(20, 4).parameters(), lr=0.1, momentum=0.9)),
    }
    for what, build in others.items():
        other = build()
        try:
            other.load_state_dict(saved)
        except ValueError as error:
            errors[what] = str(error)
            continue
        raise AssertionError(f"a checkpoint with other {what} was accepted")
    assert "levels" in errors["levels"] and "differ" in errors["levels"], errors
    assert "another compression" in errors["compression"], errors
    # Accordion's checks now come before torch's, so that nothing loads half (issue 18, R7); this
    # other optimizer also has another compression (none), which is what it says.
    assert "another compression" in errors["model"], errors
    return errors


def check_verify_levels_passes_with_rank_skewed_data_and_catches_a_divergence():
    model = make_model()
    optimizer = wrap(model, Compression.powersgd(2, 1, min_compression_rate=0), window_steps=2, interval=1,
                     verify_levels=True)
    for step in range(16):
        x, y = rank_batch(step)
        if hvd.rank() == 0:
            y = torch.zeros_like(y)  # one class only
        else:
            x = x * 100
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    checks = optimizer.accordion_stats()["checks"]
    assert len(checks) >= 6, checks
    if hvd.rank() == 1:  # a rank that decided otherwise, as a per-rank LR schedule would make it
        set_regime(optimizer._accordion, [not c for c in optimizer._accordion.detector.critical])
    try:
        optimizer._exchange.verify_same_levels()
    except RuntimeError as error:
        assert "rank(s) [1]" in str(error), error
        return str(error)
    raise AssertionError("diverged levels passed verify_levels")


def check_windows_never_closed_warn_when_the_optimizer_goes():
    def run(close):
        model = make_model()
        optimizer = wrap(model, Compression.powersgd(2, 1))
        train(model, optimizer, 2)
        if close:
            optimizer.end_epoch()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del optimizer
            gc.collect()
        return [str(w.message) for w in caught if "never closed a detection window" in str(w.message)]

    assert run(close=True) == []
    messages = run(close=False)
    assert len(messages) == 1 and "end_epoch()" in messages[0], messages
    return messages[0]


def check_a_nan_gradient_warns_naming_the_layer_and_switches_nothing():
    model = make_model()
    optimizer = wrap(model, Compression.powersgd(2, 1, min_compression_rate=0), window_steps=2, interval=1,
                     verify_levels=True)
    stock = horovod.DistributedOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.1))
    params, stock_params = list(model.parameters()), [p for g in stock.param_groups for p in g["params"]]
    caught_all = []
    for step in range(6):
        set_rank_gradients(params, step)
        if step == 3 and hvd.rank() == 1:
            params[2].grad[0, 0] = float("nan")
        for p, q in zip(params, stock_params):
            q.grad = p.grad.clone()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            optimizer.synchronize()
        caught_all += [str(w.message) for w in caught if "non-finite" in str(w.message)]
        stock.synchronize()
        for p, q in zip(params, stock_params):  # finite where Horovod's average is, non-finite where it is
            assert torch.equal(torch.isfinite(p.grad).all(), torch.isfinite(q.grad).all()), step
        optimizer.zero_grad()
    levels = [check["levels"] for check in optimizer.accordion_stats()["checks"]]
    if hvd.rank() == 1:
        assert len(caught_all) == 1 and "'2.weight' (1 steps)" in caught_all[0], caught_all
    else:
        assert caught_all == [], caught_all
    assert horovod.allgather_object(levels)[0] == levels
    return caught_all


def check_zero_empty_and_complex_parameters():
    outcomes = {}
    for compression in (Compression.none, Compression.powersgd(2, 1, min_compression_rate=0),
                        Compression.topk(0.5, 0.1)):
        empty = torch.nn.Parameter(torch.zeros(0, 5))
        layer = torch.nn.Linear(6, 5)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD([empty, *layer.parameters()], lr=0.1),
                                             compression=compression, window_steps=1, interval=1)
        for step in range(4):  # all-zero gradients through checks: nothing breaks, nothing turns NaN
            empty.grad = torch.zeros(0, 5)
            layer.weight.grad, layer.bias.grad = torch.zeros(5, 6), torch.zeros(5)
            optimizer.step()
            assert torch.equal(layer.weight.grad, torch.zeros(5, 6)), (compression, step)
        set_rank_gradients(list(layer.parameters()), 0)  # and real gradients after them still get through
        optimizer.step()
        assert torch.isfinite(layer.weight.grad).all() and layer.weight.grad.abs().max() > 0, compression
        outcomes[repr(compression)] = optimizer.accordion_stats()["levels"]
    complex_layer = torch.nn.Parameter(torch.zeros(3, 3, dtype=torch.complex64))
    try:
        hvd.DistributedOptimizer(torch.optim.SGD([complex_layer], lr=0.1), compression=Compression.powersgd(1))
    except TypeError as error:
        assert "real floating-point" in str(error) and "complex64" in str(error), error
        outcomes["complex"] = str(error)
    else:
        raise AssertionError("a complex parameter was accepted")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(6, 5).parameters(), lr=0.1),
                                 compression=Compression.powersgd(8, min_compression_rate=0))
    outcomes["rank above min(n, m)"] = [str(w.message) for w in caught if "exceeds min(n, m)" in str(w.message)]
    assert len(outcomes["rank above min(n, m)"]) == 1, outcomes
    return outcomes


# Independent references: numpy, float64, every rank's gradients recomputed locally.

def reference_gradients(ranks, step, shapes):
    """What ``set_rank_gradients`` gives each of ``ranks`` at ``step``."""
    out = []
    for rank in ranks:
        generator = torch.Generator().manual_seed(7919 * rank + step)
        out.append([torch.randn(shape, generator=generator).double().numpy() for shape in shapes])
    return out


def numpy_powersgd(ranks, steps, rank_at_step, shape, seed=0):
    """Vogels et al., Alg. 1, with error feedback and a Q kept at the widest rank."""
    n, m = shape
    q = initial_query(seed, 0, m, max(rank_at_step))
    memory = {r: np.zeros(shape) for r in ranks}
    outputs = []
    for step in range(steps):
        k = rank_at_step[step]
        grads = dict(zip(ranks, (g[0] for g in reference_gradients(ranks, step, [shape]))))
        ms = {r: grads[r] + memory[r] for r in ranks}
        p = np.mean([ms[r] @ q[:, :k] for r in ranks], axis=0)
        p, _ = np.linalg.qr(p)
        q_new = np.mean([ms[r].T @ p for r in ranks], axis=0)
        out = p @ q_new.T
        for r in ranks:
            memory[r] = ms[r] - out
        q[:, :k] = q_new
        outputs.append(out)
    return outputs


def numpy_topk(ranks, steps, fraction_at_step, shape):
    residual = {r: np.zeros(int(np.prod(shape))) for r in ranks}
    outputs = []
    for step in range(steps):
        grads = dict(zip(ranks, (g[0].reshape(-1) for g in reference_gradients(ranks, step, [shape]))))
        total = np.zeros(int(np.prod(shape)))
        for r in ranks:
            m = grads[r] + residual[r]
            kept = np.argsort(-np.abs(m))[:max(1, int(fraction_at_step[step] * m.size))]
            total[kept] += m[kept]
            residual[r] = m.copy()
            residual[r][kept] = 0
        outputs.append((total / len(ranks)).reshape(shape))
    return outputs


def compare_with_reference(compression, levels_at_step, reference, process_set=horovod.global_process_set,
                           ranks=(0, 1)):
    weight = torch.nn.Parameter(torch.zeros(12, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([weight], lr=0.1), compression=compression,
                                         process_set=process_set)
    expected = reference(list(ranks), len(levels_at_step), levels_at_step, (12, 10))
    errors = []
    for step, level in enumerate(levels_at_step):
        optimizer._reducer.set_levels([level])
        set_rank_gradients([weight], step)
        optimizer.synchronize()
        got = weight.grad.double().numpy()
        errors.append(float(np.linalg.norm(got - expected[step]) / np.linalg.norm(expected[step])))
        optimizer.zero_grad()
    assert max(errors) < 1e-5, errors
    return errors


def check_powersgd_with_error_feedback_and_a_rank_switch_matches_numpy():
    return compare_with_reference(Compression.powersgd(3, 1, min_compression_rate=0), [3, 3, 1, 1, 1, 3, 3],
                                  numpy_powersgd)


def check_topk_residuals_over_steps_match_numpy():
    return compare_with_reference(Compression.topk(0.5, 0.1), [0.5, 0.1, 0.1, 0.5, 0.1], numpy_topk)


def check_a_single_rank_process_set_reduces_within_the_set_only():
    """Each rank trains alone in its own set: the result is the one-worker reference."""
    own = SINGLE_RANK_SETS[hvd.rank()]
    return {"powersgd": compare_with_reference(Compression.powersgd(3, 1, min_compression_rate=0),
                                               [3, 1, 3], numpy_powersgd, own, ranks=(hvd.rank(),)),
            "topk": compare_with_reference(Compression.topk(0.5, 0.1), [0.1, 0.5], numpy_topk, own,
                                           ranks=(hvd.rank(),))}


def check_sum_predivide_and_two_backward_passes_on_the_compressed_paths():
    def synchronized(compression, passes=1, **kwargs):
        torch.manual_seed(0)
        layer = torch.nn.Linear(10, 12)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), compression=compression,
                                             backward_passes_per_step=passes, **kwargs)
        for k in range(passes):  # .grad accumulates over the passes, as in Horovod
            generator = torch.Generator().manual_seed(31 * hvd.rank() + k)
            layer(torch.randn(8, 10, generator=generator)).pow(2).sum().backward()
        optimizer.synchronize()
        return [p.grad.clone() for p in layer.parameters()]

    for compression in (Compression.powersgd(2, 1, min_compression_rate=0), Compression.topk(0.5, 0.1)):
        average = synchronized(compression)
        for a, b in zip(synchronized(compression, op=hvd.Sum), average):
            assert torch.allclose(a, 2 * b, rtol=1e-5, atol=1e-5), (compression, "Sum")
        for a, b in zip(synchronized(compression, gradient_predivide_factor=2.0), average):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), (compression, "predivide")
    # Two passes, on the dense path where Horovod's own optimizer is the reference.
    ours = synchronized(Compression.none, passes=2)
    torch.manual_seed(0)
    layer = torch.nn.Linear(10, 12)
    stock = horovod.DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), backward_passes_per_step=2)
    for k in range(2):
        generator = torch.Generator().manual_seed(31 * hvd.rank() + k)
        layer(torch.randn(8, 10, generator=generator)).pow(2).sum().backward()
    stock.synchronize()
    for a, b in zip(ours, layer.parameters()):
        assert torch.allclose(a, b.grad, rtol=1e-6, atol=1e-6), "two backward passes"


def check_batch_switch_state_dict_carries_a_large_batch_in_progress():
    switch = BatchSwitch(small_batch=16, multiplier=4)

    def build(model):
        return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), batch_switch=switch,
                                        window_steps=2, interval=1)

    def micro_batch(model, optimizer, step):
        x, y = rank_batch(step)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    model = make_model()
    optimizer = build(model)
    step = 0
    while not (optimizer.micro_batches_per_step == 4 and optimizer._steps.pending_micro_batches == 2):
        micro_batch(model, optimizer, step)
        step += 1
        assert step < 100, "the large batch never came"
    saved_model, saved_optimizer = model.state_dict(), optimizer.state_dict()
    resumed = make_model(seed=3)
    resumed.load_state_dict(saved_model)
    resumed_optimizer = build(resumed)
    resumed_optimizer.load_state_dict(saved_optimizer)
    for k in range(step, step + 10):
        micro_batch(model, optimizer, k)
        micro_batch(resumed, resumed_optimizer, k)
    for (name, a), b in zip(model.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), f"{name} differs after resuming mid-way through a large batch"
    return step


def check_a_step_makes_no_host_copy_outside_a_check():
    """The GPU path, proven on CPU: between checks, a step never moves a tensor to the host
    (no ``.cpu()``, ``.item()``, ``.numpy()``, ``.tolist()``), so on a GPU it never waits. The
    one host read of an adaptive step is the learning rate its last step agreed on
    (``read_host_state``, ``core.rates``), copied to the host without waiting when it arrived:
    counted apart, once per step."""
    from horovod_accordion.torch_common.tensors import TorchTensorOps

    counts = {}
    originals = {name: getattr(torch.Tensor, name) for name in ("cpu", "item", "numpy", "tolist")}
    read_host_state = TorchTensorOps.read_host_state
    reading = []

    def counting(name):
        def wrapper(self, *args, **kwargs):
            if not reading:
                counts[name] = counts.get(name, 0) + 1
            return originals[name](self, *args, **kwargs)
        return wrapper

    def counted_read(tensors, holder):
        counts["read_host_state"] = counts.get("read_host_state", 0) + 1
        reading.append(True)
        try:
            return read_host_state(tensors, holder)
        finally:
            reading.pop()

    def host_copies(compression, window_steps):
        model = make_model()
        optimizer = wrap(model, compression, window_steps=window_steps)
        train(model, optimizer, 1)  # the first step may set things up
        for name in originals:
            setattr(torch.Tensor, name, counting(name))
        TorchTensorOps.read_host_state = counted_read
        try:
            train(model, optimizer, 3)
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)
            TorchTensorOps.read_host_state = read_host_state
        copies = dict(counts)
        counts.clear()
        return copies

    per_compression = {repr(c): host_copies(c, window_steps=100) for c in (
        Compression.none, Compression.fp16, Compression.powersgd(2, 1, min_compression_rate=0),
        Compression.topk(0.5, 0.1), Compression.quantized(8, 4))}
    adaptive = {repr(c) for c in (Compression.powersgd(2, 1, min_compression_rate=0), Compression.topk(0.5, 0.1),
                                  Compression.quantized(8, 4))}
    assert all(c == ({"read_host_state": 3} if name in adaptive else {}) for name, c in per_compression.items()), \
        per_compression
    # The guard sees copies where there are some: a check reads the norms, once.
    at_checks = host_copies(Compression.powersgd(2, 1, min_compression_rate=0), window_steps=1)
    assert at_checks.get("tolist", 0) >= 3, at_checks
    return per_compression, at_checks


def check_waiting_for_a_slower_rank_leaves_the_core_free():
    """Horovod's ``synchronize()`` spins a core while its collective runs. Where ranks share the
    cores, that spin takes the core from the reduction and from the other ranks' compute. Here
    rank 1 arrives 1.5 s late to a step, and rank 0's training thread, waiting for the buckets'
    phases, spends a small part of the wait on the CPU (a spin spends all of it, or half with
    another thread on its core): with a static compression, and with an adaptive one, whose
    learning rate's agreement was a blocking, spinning allreduce at the first hook (issue 45)."""
    waits = {}
    for compression in (Compression.powersgd(1, min_compression_rate=0),
                        Compression.powersgd(2, 1, min_compression_rate=0)):
        model = make_model()
        optimizer = wrap(model, compression)
        train(model, optimizer, 1)
        if hvd.rank() == 1:
            time.sleep(1.5)
        cpu_s, wall_s = time.thread_time(), time.perf_counter()
        x, y = rank_batch(1)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        cpu_s, wall_s = time.thread_time() - cpu_s, time.perf_counter() - wall_s
        if hvd.rank() == 0:
            assert wall_s > 1.0, wall_s  # rank 0 did wait for rank 1
            assert cpu_s < 0.25 * wall_s, f"{compression!r}: {cpu_s:.2f} s of CPU over a {wall_s:.2f} s wait"
        waits[repr(compression)] = (cpu_s, wall_s)
    return waits


def check_topk_sends_each_layer_the_cheaper_way_with_the_same_result():
    """Values and indices, or the sparsified layer through the allreduce: the same average
    and residuals, and never more bytes than a dense fp32 allreduce, at any level. The
    4,000-entry layer has int16 indices, the 40,000-entry one int32."""
    shapes = [(40, 100), (200, 200), (7,)]
    fractions = [1.0, 0.99, 0.7, 0.5, 0.3, 0.1, 0.01]
    runs = {}
    for wire in ("auto", "sparse", "dense"):
        params = [torch.nn.Parameter(torch.zeros(shape)) for shape in shapes]
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                             compression=Compression.topk(1.0, 0.01, wire=wire), lr_decay_factor=None)
        outputs = []
        for step, fraction in enumerate(fractions):
            optimizer._reducer.set_levels([fraction] * len(shapes))
            set_rank_gradients(params, step)
            optimizer.synchronize()
            outputs.append([p.grad.clone() for p in params] + [r.clone() for r in optimizer._reducer.residual.values()])
            optimizer.zero_grad()
        runs[wire] = (outputs, optimizer.accordion_stats()["bytes_per_step"])
    dense_fp32 = sum(4 * int(np.prod(shape)) for shape in shapes)
    for wire in ("sparse", "dense"):
        for step, (a, b) in enumerate(zip(runs["auto"][0], runs[wire][0])):
            for x, y in zip(a, b):
                assert torch.allclose(x, y, atol=1e-6, rtol=0), (wire, step, (x - y).abs().max())
    auto_bytes = runs["auto"][1]
    assert all(sent <= dense_fp32 for sent in auto_bytes), (auto_bytes, dense_fp32)
    assert auto_bytes[-2] < dense_fp32 / 4, auto_bytes  # TopK 10 %: values and indices
    return {"dense fp32": dense_fp32, **{wire: sent for wire, (_, sent) in runs.items()}}
