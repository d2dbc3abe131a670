"""How the adapters meet their users' code, on 2 real ranks, torch and TF: misuse refused with
its fix (a call at the wrong point, a frozen or unfrozen layer, several optimizers, another
configuration's checkpoint), micro-batches and warm starts handed over intact, wire choices
and collective names that agree across ranks. Each check failed before its fix (the CHANGELOG
names the fixes)."""
import os
import warnings

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import tensorflow as tf
import torch
import horovod.tensorflow as horovod_tf
import horovod.torch as horovod

import horovod_accordion.tensorflow as hvd_tf
import horovod_accordion.torch as hvd
from horovod_accordion.core.compression import sparse_is_cheaper
from horovod_accordion.torch import BatchSwitch, Compression
from tests.workers.torch_checks import assert_same_on_all_ranks, gathered, rank_batch, set_rank_gradients
from tests.workers.models import make_model
from tests.workers.policy_reference import set_regime


def setup():
    hvd.init()
    horovod_tf.init()
    torch.set_num_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    return hvd.rank()


def micro_batch_loss(model, step):
    x, y = rank_batch(step)
    return torch.nn.functional.cross_entropy(model(x), y)


def check_batch_switch_with_an_explicit_synchronize_trains_as_step_alone():
    """The README's clipping recipe, ``synchronize()`` then ``step()`` under ``skip_synchronize()``,
    used to complete a step of 0 micro-batches, whose LR factor ramps to 0: training stopped.
    Stepping only when ``synchronize()`` returns True (the AMP recipe) trains the same."""
    runs = {}
    for recipe in ("step alone", "synchronize, then step", "step when synchronize() is True",
                   "zero_grad only after a step"):
        model = make_model()
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
            batch_switch=BatchSwitch(small_batch=16, multiplier=2), window_steps=2, interval=1, eta=1e9)
        moved, communicated = None, 0
        for step in range(24):
            if step == 16:
                before = [p.detach().clone() for p in model.parameters()]
            if recipe != "zero_grad only after a step":
                optimizer.zero_grad()
            micro_batch_loss(model, step).backward()
            if recipe == "step alone":
                optimizer.step()
                continue
            complete = optimizer.synchronize()
            communicated += complete
            if complete:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1e6)  # clips nothing: the same maths
            if complete or recipe == "synchronize, then step":
                with optimizer.skip_synchronize():
                    optimizer.step()
            if complete and recipe == "zero_grad only after a step":
                optimizer.zero_grad()
            if step == 23:
                moved = max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before))
        micro_batches = [record["micro_batches"] for record in optimizer.accordion_stats()["steps_extra"]]
        assert 2 in micro_batches, f"the large batch never came: {micro_batches}"
        assert min(micro_batches) >= 1, f"a step of no micro-batch: {micro_batches}"
        if recipe != "step alone":
            assert communicated == len(micro_batches), (recipe, communicated, micro_batches)
            assert moved > 0, f"{recipe}: no training over micro-batches 16-23"
        runs[recipe] = model
    for recipe, model in runs.items():
        for (name, a), b in zip(runs["step alone"].named_parameters(), model.parameters()):
            assert torch.equal(a, b), f"{name}: '{recipe}' trains otherwise than step() alone"
        assert_same_on_all_ranks(model)
    return sorted(runs)


def check_powersgd_without_warm_start_draws_a_new_q_every_step_alike_on_every_rank():
    """``warm_start=False`` used to project every step on the same initial Q."""
    layer = torch.nn.Linear(16, 12, bias=False)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(layer.parameters(), lr=0.0), named_parameters=layer.named_parameters(),
        compression=Compression.powersgd(1, min_compression_rate=0, use_error_feedback=False, warm_start=False))
    outputs, queries = [], []
    for _ in range(4):
        set_rank_gradients([layer.weight], step=0)  # the same gradient every step
        optimizer.synchronize()
        outputs.append(layer.weight.grad.clone())
        queries.append(optimizer._reducer.q[0].clone())
        with optimizer.skip_synchronize():
            optimizer.step()
    for k in range(1, 4):
        assert not torch.equal(outputs[k], outputs[0]), f"step {k} projected on step 0's Q"
    for q in queries:
        rows = gathered(q)
        assert torch.equal(rows[0], rows[1]), "the ranks drew different Qs"
    return [float(o.norm()) for o in outputs]


def check_tf_powersgd_without_warm_start_draws_a_new_q_every_step_alike_on_every_rank():
    state = hvd_tf.AccordionState([tf.Variable(tf.zeros((16, 12)))], hvd_tf.Compression.powersgd(
        1, min_compression_rate=0, use_error_feedback=False, warm_start=False))
    grad = tf.constant(np.random.RandomState(hvd.rank()).standard_normal((16, 12)).astype(np.float32))
    reduce = tf.function(lambda: state.reduce([grad])[0])
    outputs = [reduce().numpy() for _ in range(4)]
    for k in range(1, 4):
        assert not np.array_equal(outputs[k], outputs[0]), f"step {k} projected on step 0's Q"
    q = state.reducer_variables["q_0"].numpy()
    rows = horovod_tf.allgather(tf.constant(q[None])).numpy()
    assert np.array_equal(rows[0], rows[1]), "the ranks drew different Qs"
    return [float(np.linalg.norm(o)) for o in outputs]


class TwoModules(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 24))
        self.b = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(24, 4))

    def forward(self, x):
        return self.b(self.a(x))


def check_two_optimizers_with_buckets_in_flight_in_one_backward():
    """The GAN and per-module pattern: two optimizers over disjoint parts of one model, one
    backward, then both steps. Collective names used to collide in Horovod."""
    results = {}
    for compression in (Compression.none, Compression.powersgd(2, 1), Compression.topk(0.5, 0.1)):
        model = TwoModules()
        optimizers = [hvd.DistributedOptimizer(torch.optim.SGD(part.parameters(), lr=0.1),
                                               named_parameters=part.named_parameters(prefix=prefix),
                                               compression=compression)
                      for prefix, part in (("a", model.a), ("b", model.b))]
        for step in range(3):
            for optimizer in optimizers:
                optimizer.zero_grad()
            micro_batch_loss(model, step).backward()
            for optimizer in optimizers:
                optimizer.step()
        assert_same_on_all_ranks(model)
        results[repr(compression)] = float(sum(p.norm() for p in model.parameters()))
    return results


def check_two_unnamed_optimizers_over_same_shaped_parts_do_not_collide():
    """Without named_parameters both get Horovod's ``allreduce.noname.*`` names: the second
    live exchange over the same names is numbered."""
    parts = [torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)]
    optimizers = [hvd.DistributedOptimizer(torch.optim.SGD(part.parameters(), lr=0.1),
                                           compression=Compression.powersgd(1)) for part in parts]
    assert optimizers[0]._collectives.name_prefix != optimizers[1]._collectives.name_prefix
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(hvd.rank()))
    for optimizer in optimizers:
        optimizer.zero_grad()
    parts[1](parts[0](x)).sum().backward()
    for optimizer in optimizers:
        optimizer.step()
    for part in parts:
        assert_same_on_all_ranks(part)


def check_end_epoch_between_backward_and_step_is_a_clear_error():
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1), bucket_cap_mb=None)
    optimizer.zero_grad()
    micro_batch_loss(model, 0).backward()
    try:
        optimizer.end_epoch()
    except RuntimeError as error:
        message = str(error)
    else:
        raise AssertionError("end_epoch() switched levels while the step's buckets were in flight")
    assert "after optimizer.step()" in message, message
    optimizer.step()
    optimizer.end_epoch()  # after the step, it closes the window
    assert optimizer._accordion.detector.windows_seen == 1
    return message


def check_batch_switch_with_backward_passes_per_step_is_refused_as_in_tensorflow():
    model = make_model()
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=2,
                                 batch_switch=BatchSwitch(small_batch=16, multiplier=2))
    except ValueError as error:
        assert "backward_passes_per_step" in str(error), error
        return str(error)
    raise AssertionError("torch silently ignored backward_passes_per_step under batch_switch")


def check_a_checkpoint_with_other_detector_arguments_warns_naming_them():
    model = make_model()
    saved = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters(),
                                     compression=Compression.powersgd(2, 1), eta=0.5, interval=3).state_dict()
    other = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters(),
                                     compression=Compression.powersgd(2, 1), eta=0.3, interval=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        other.load_state_dict(saved)
    messages = [str(w.message) for w in caught if "eta=0.5 (constructed with 0.3)" in str(w.message)]
    assert messages and "the checkpoint's values win" in messages[0], [str(w.message) for w in caught]
    assert other._accordion.detector.eta == 0.5
    return messages[0]


def check_a_checkpoint_of_other_shapes_is_a_value_error_and_restores_nothing():
    """Same names, other shapes: the schedule, and before it the wrapped optimizer's learning rate
    and momenta, used to load before a raw shape error."""
    def build(width, lr):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(20, width), torch.nn.ReLU(), torch.nn.Linear(width, 4))
        return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                        named_parameters=model.named_parameters(),
                                        compression=Compression.powersgd(2, 1), window_steps=1, interval=1), model

    trained, model = build(32, lr=0.2)
    for step in range(3):
        trained.zero_grad()
        micro_batch_loss(model, step).backward()
        trained.step()
    fresh, _ = build(16, lr=0.1)
    try:
        fresh.load_state_dict(trained.state_dict())
    except ValueError as error:
        message = str(error)
    else:
        raise AssertionError("a checkpoint of other shapes was accepted")
    assert "shape" in message, message
    assert fresh._accordion.step == 0 and fresh._accordion.detector.windows_seen == 0, "half restored: schedule"
    assert fresh.param_groups[0]["lr"] == 0.1 and not fresh.state, "half restored: the wrapped optimizer"
    return message


def check_ranks_that_built_different_numbers_of_exchanges_agree_on_collective_names():
    """The names' number came from what each process had built (or still held alive): ranks
    that differ there must still send the same names."""
    from horovod_accordion.core.arguments import collective_prefix

    model = make_model()
    names = [name for name, _ in model.named_parameters()]
    if hvd.rank() == 1:
        collective_prefix(names)  # as if rank 1 had built an optimizer over these names before
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1))
    prefixes = horovod.allgather_object(optimizer._collectives.name_prefix)
    assert prefixes[0] == prefixes[1], prefixes
    optimizer.zero_grad()
    micro_batch_loss(model, 0).backward()
    optimizer.step()
    assert_same_on_all_ranks(model)
    return prefixes[0]


def check_topk_wire_choice_does_not_wrap_in_int32():
    """kept·(4 + index bytes)·size wrapped past 2³¹ in TF's int32: a huge layer chose the
    costlier sparse path."""
    kept, numel = 67_108_870, 68_000_000  # 64·kept = 2³² + 384
    assert not sparse_is_cheaper(kept, numel, 4, 8)
    assert not bool(sparse_is_cheaper(tf.constant(kept, tf.int32), numel, 4, 8))
    assert bool(sparse_is_cheaper(tf.constant(1000, tf.int32), numel, 4, 8))


def check_tf_variables_other_than_the_states_are_refused():
    """``zip`` used to truncate a shorter list, and a reordered one mixed layers' error feedback."""
    variables = [tf.Variable(tf.ones((6, 4))), tf.Variable(tf.ones((4, 6)))]
    state = hvd_tf.AccordionState(variables, hvd_tf.Compression.powersgd(1, min_compression_rate=0))
    messages = []
    for given in (variables[::-1], variables[:1]):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(variables[0] @ variables[1])
        tape = hvd_tf.DistributedGradientTape(tape, accordion=state)
        try:
            tape.gradient(loss, given)
        except ValueError as error:
            messages.append(str(error))
            continue
        raise AssertionError("the tape exchanged variables other than the state's")
    assert "at position 0" in messages[0] and "at position 1" in messages[1], messages
    return messages


def check_keras_fit_without_the_callback_warns_at_the_first_step():
    """It used to run the whole training at ℓ_low without a word."""
    import tf_keras
    import horovod_accordion.keras as hvd_keras

    caught = {}
    for with_callback in (False, True):
        tf_keras.utils.set_random_seed(0)
        model = tf_keras.Sequential([tf_keras.layers.Dense(8, input_shape=(6,)), tf_keras.layers.Dense(2)])
        model.compile(optimizer=hvd_keras.DistributedOptimizer(
            tf_keras.optimizers.legacy.SGD(0.1), compression=hvd_keras.Compression.powersgd(2, 1)), loss="mse")
        x = np.random.RandomState(hvd.rank()).standard_normal((16, 6)).astype(np.float32)
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            model.fit(x, x[:, :2], batch_size=8, epochs=1, verbose=0,
                      callbacks=[hvd_keras.AccordionCallback()] if with_callback else [])
        caught[with_callback] = [str(w.message) for w in records if "AccordionCallback" in str(w.message)]
    assert caught[False] and "stays at ℓ_low" in caught[False][0], caught
    assert not caught[True], caught
    return caught[False][0]


def check_named_parameters_that_differ_from_the_optimizers_say_which():
    model = make_model()
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        hvd.DistributedOptimizer(torch.optim.SGD(model[0].parameters(), lr=0.1),
                                 named_parameters=model.named_parameters())
    foreign = [str(w.message) for w in records if "does not hold" in str(w.message)]
    assert foreign and "2.weight" in foreign[0], [str(w.message) for w in records]
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=list(model.named_parameters())[:2])
    except ValueError as error:
        assert "of shape (24, 32)" in str(error), error
        return [foreign[0], str(error)]
    raise AssertionError("a subset of named_parameters was accepted")


def check_horovods_warmup_callback_with_the_non_legacy_keras_optimizer():
    """It failed with "'float' object has no attribute 'dtype'" on tf_keras.optimizers.SGD."""
    import tf_keras
    import horovod_accordion.keras as hvd_keras

    x = np.random.RandomState(hvd.rank()).standard_normal((16, 6)).astype(np.float32)
    outcomes = {}
    for momentum in (0.0, 0.9):
        tf_keras.utils.set_random_seed(0)
        model = tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(6,))])
        model.compile(optimizer=hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.1, momentum=momentum)),
                      loss="mse")
        warmup = hvd_keras.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2, verbose=0)
        try:
            history = model.fit(x, x[:, :2], batch_size=8, epochs=2, verbose=0, callbacks=[warmup])
            outcomes[momentum] = history.history["loss"]
        except ValueError as error:
            outcomes[momentum] = str(error)
    assert isinstance(outcomes[0.0], list), outcomes  # no momentum: the warm-up just works
    assert "tf_keras.optimizers.legacy.SGD" in outcomes[0.9], outcomes
    return {str(k): v for k, v in outcomes.items()}


def check_a_rank_restored_without_its_pending_micro_batches_averages_what_it_holds():
    """R4: after rank 0's checkpoint is restored on every rank mid-way through a large batch,
    rank 1 shares the count (2 of 4) but not the gradients: it used to divide its next sum of
    2 micro-batches by 4."""
    switch = BatchSwitch(small_batch=16, multiplier=4, warmup_steps=0)

    def build(model):
        return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        named_parameters=model.named_parameters(), batch_switch=switch,
                                        window_steps=2, interval=1, eta=1e9)

    model = make_model()
    optimizer = build(model)
    step = 0
    while not (optimizer.micro_batches_per_step == 4 and optimizer._steps.pending_micro_batches == 2):
        optimizer.zero_grad()
        micro_batch_loss(model, step).backward()
        optimizer.step()
        step += 1
        assert step < 100, "the large batch never came"
    saved = horovod.broadcast_object({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, 0)
    model = make_model(seed=5)  # a fresh process: no gradients
    model.load_state_dict(saved["model"])
    optimizer = build(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rank 1's warning that its per-rank state restarts
        optimizer.load_state_dict(saved["optimizer"])
    optimizer.zero_grad()
    micro_batch_loss(model, step).backward()
    assert optimizer.step() is None  # the third micro-batch of four
    optimizer.zero_grad()
    micro_batch_loss(model, step + 1).backward()
    local_sum = [p.grad.clone() for p in model.parameters()]
    held = 4 if hvd.rank() == 0 else 2
    expected = [horovod.allreduce(g / held, op=horovod.Average) for g in local_sum]
    optimizer.synchronize()
    for (name, p), want in zip(model.named_parameters(), expected):
        assert torch.allclose(p.grad, want, rtol=1e-6, atol=0), \
            f"{name}: max difference {(p.grad - want).abs().max():.3g} from each rank's mean over what it holds"
    with optimizer.skip_synchronize():
        optimizer.step()
    return held


def check_tf_distributed_optimizer_has_horovods_signature_and_takes_v1_optimizers():
    """R10: it was the Keras one, without use_locking, and refused tf.compat.v1 optimizers."""
    import inspect

    ours = list(inspect.signature(hvd_tf.DistributedOptimizer).parameters.values())
    theirs = list(inspect.signature(horovod_tf.DistributedOptimizer).parameters.values())
    assert [(p.name, p.default) for p in ours[:len(theirs)]] == [(p.name, p.default) for p in theirs]
    variable = tf.Variable(tf.ones(4))
    optimizer = hvd_tf.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5), use_locking=True)
    data = tf.constant(np.random.RandomState(hvd.rank()).standard_normal(4).astype(np.float32))
    optimizer.minimize(lambda: tf.reduce_sum(variable * data), var_list=[variable])
    rows = horovod_tf.allgather(variable.read_value()[None]).numpy()
    assert np.array_equal(rows[0], rows[1]), "the ranks applied different gradients"
    assert not np.array_equal(rows[0], np.ones(4, np.float32)), "no step was applied"
    try:
        hvd_tf.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5),
                                    compression=hvd_tf.Compression.powersgd(1))
    except ValueError as error:
        assert "DistributedGradientTape(accordion=...)" in str(error), error
        return str(error)
    raise AssertionError("a v1 optimizer with PowerSGD was accepted")


def check_broadcast_optimizer_state_sends_tensors_as_tensors():
    """R3: the whole state was pickled, so on GPU every rank unpickled the root's CUDA tensors
    onto the root's device. Only scalars are pickled now; Adam's state (its 0-d step included)
    arrives whole."""
    model = make_model(seed=hvd.rank())  # different on every rank
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1))
    if hvd.rank() == 0:  # only the root has trained: momenta and Q to share
        for step in range(2):
            set_rank_gradients(list(model.parameters()), step)
            torch.optim.Adam.step(optimizer)
    pickled = []
    real_broadcast_object = horovod.broadcast_object

    def recording(value, *args, **kwargs):
        pickled.append(value)
        return real_broadcast_object(value, *args, **kwargs)

    horovod.broadcast_object = recording
    try:
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    finally:
        horovod.broadcast_object = real_broadcast_object

    def tensors_in(value):
        if torch.is_tensor(value):
            return 1
        if isinstance(value, dict):
            return sum(tensors_in(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return sum(tensors_in(v) for v in value)
        return 0

    assert pickled and all(tensors_in(value) == 0 for value in pickled), "a tensor was pickled"
    state = optimizer.state_dict()
    for index, entry in state["state"].items():
        for key, value in entry.items():
            assert_rows_equal_tensor(value, f"Adam's {key} of parameter {index}")
    for layer, q in state["accordion"]["reducer"]["q"].items():
        assert_rows_equal_tensor(q, f"Q of layer {layer}")
    return len(state["state"])


def assert_rows_equal_tensor(tensor, what):
    rows = gathered(tensor.float().reshape(-1))
    assert torch.equal(rows[0], rows[1]), f"{what} differs across ranks"


def check_tf_rank_restored_without_its_pending_micro_batches_averages_what_it_holds():
    """R4 in TF: rank 0 alone restores a state two micro-batches into a large batch of four and
    shares it; rank 1, fresh, used to divide its two micro-batches by four."""
    variables = [tf.Variable(tf.zeros(4))]

    def build():
        return hvd_tf.AccordionState(variables, hvd_tf.Compression.none,
                                     batch_switch=BatchSwitch(small_batch=1, multiplier=4, warmup_steps=0),
                                     window_steps=1, interval=1, eta=1e9)

    def grads(k):
        return [tf.constant(np.full(4, 1.0 + k + 10 * hvd.rank(), np.float32))]

    def micro_batch(state, k):
        state.begin_micro_batch(0.1)
        state.add_micro_batch(grads(k))
        averaged = state.reduce_pending() if bool(state.apply_now.numpy()) else None
        state.end_micro_batch()
        return averaged

    first, k = build(), 0
    while not (first.micro_batches_per_step == 4 and first._steps.pending_micro_batches == 2):
        micro_batch(first, k)
        k += 1
        assert k < 50, "the large batch never came"
    second = build()
    if hvd.rank() == 0:
        second.load_snapshot(first.snapshot())  # rank 0 restores its own state; rank 1 starts fresh
    second.broadcast_shared_state(0)
    assert micro_batch(second, k) is None  # the third of four
    averaged = micro_batch(second, k + 1)[0].numpy()
    held = [k - 2, k - 1, k, k + 1] if hvd.rank() == 0 else [k, k + 1]
    mine = sum(grads(j)[0].numpy() for j in held) / len(held)
    expected = horovod_tf.allreduce(tf.constant(mine), op=horovod_tf.Average).numpy()
    np.testing.assert_allclose(averaged, expected, rtol=1e-6)
    return held


def train_steps(model, optimizer, steps, first=0):
    for step in range(first, first + steps):
        x, y = rank_batch(step)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def check_a_layer_frozen_mid_run_stops_moving_and_one_unfrozen_is_named():
    """Frozen after construction: PowerSGD's memory kept moving it (its gradient was the memory's
    approximation). Unfrozen after construction: never averaged, so the replicas drift: a warning."""
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(1, 1, min_compression_rate=0))
    train_steps(model, optimizer, 3)
    assert optimizer._reducer.memory[0].abs().sum() > 0, "the memory holds something to move the layer with"
    model[0].weight.requires_grad_(False)
    model[0].weight.grad = None
    frozen = model[0].weight.detach().clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_steps(model, optimizer, 2, first=3)
    assert torch.equal(model[0].weight, frozen), "a frozen layer moved"
    assert any("'0.weight' was frozen after" in str(w.message) for w in caught), [str(w.message) for w in caught]

    late = make_model()
    late[2].weight.requires_grad_(False)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(late.parameters(), lr=0.1),
                                         named_parameters=late.named_parameters())
    late[2].weight.requires_grad_(True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_steps(late, optimizer, 1)
    assert any("'2.weight' was frozen when the optimizer was built" in str(w.message) for w in caught), \
        [str(w.message) for w in caught]


def check_model_zero_grad_during_a_large_batch_is_an_error_not_a_silent_loss():
    """With batch_switch, ``optimizer.zero_grad()`` keeps the micro-batches of a large batch in
    progress; ``model.zero_grad()`` wiped them without a word."""
    def large_batch_optimizer(model):
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters(),
                                             batch_switch=BatchSwitch(8, 4, warmup_steps=0))
        set_regime(optimizer._accordion, [False] * len(optimizer._params))  # the large-batch regime
        assert optimizer.micro_batches_per_step == 4
        return optimizer

    model = make_model()
    optimizer = large_batch_optimizer(model)
    train_steps(model, optimizer, 2)  # two of the four micro-batches are held
    model.zero_grad()
    x, y = rank_batch(2)
    try:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    except RuntimeError as error:
        assert "optimizer.zero_grad()" in str(error) and "2 micro-batch" in str(error), error
    else:
        raise AssertionError("the held micro-batches were wiped without a word")
    # optimizer.zero_grad() keeps them, and a new model trains through large batches.
    model = make_model()
    optimizer = large_batch_optimizer(model)
    train_steps(model, optimizer, 8)
    assert optimizer.accordion_stats()["steps"] == 2
    assert_same_on_all_ranks(model)


def check_a_keras_snapshot_of_another_configuration_is_refused_before_anything_is_assigned():
    """``load_snapshot`` (``.keras`` loading, elastic restores) assigned by position: a snapshot of
    another model was truncated or half-assigned. Count, names and shapes are checked first."""
    import numpy as np
    import horovod_accordion.tensorflow as hvd_tf

    def state(shape, compression):
        variable = tf.Variable(np.ones(shape, np.float32))
        return hvd_tf.AccordionState([variable], compression=compression, window_steps=2, interval=1)

    powersgd = hvd_tf.Compression.powersgd(2, 1, min_compression_rate=0)
    saved = state((6, 4), powersgd)
    for other in (state((5, 4), powersgd), state((6, 4), hvd_tf.Compression.topk(0.5, 0.1))):
        before = other.snapshot()
        try:
            other.load_snapshot(saved.snapshot(), saved.snapshot_names())
        except ValueError as error:
            assert "does not fit this AccordionState" in str(error), error
        else:
            raise AssertionError("a snapshot of another configuration was assigned")
        after = other.snapshot()
        assert all(np.array_equal(a, b) for a, b in zip(before, after))
    same = state((6, 4), powersgd)
    same.load_snapshot(saved.snapshot(), saved.snapshot_names())


def check_keras_batch_switch_with_several_steps_per_execution_is_refused_at_fit():
    """fit()'s batch callbacks run once per ``steps_per_execution`` batches, and batch_switch
    counts and scales each micro-batch there: the gradient scales were silently wrong."""
    import numpy as np
    import tf_keras
    import horovod_accordion.keras as hvd_keras

    model = tf_keras.Sequential([tf_keras.layers.Dense(4, input_shape=(6,))])
    optimizer = hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.01),
                                               batch_switch=BatchSwitch(small_batch=4, multiplier=2))
    model.compile(optimizer=optimizer, loss="mse", steps_per_execution=2)
    x, y = np.ones((16, 6), np.float32), np.zeros((16, 4), np.float32)
    try:
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[hvd_keras.AccordionCallback()])
    except ValueError as error:
        assert "steps_per_execution=1" in str(error), error
    else:
        raise AssertionError("batch_switch ran with steps_per_execution=2")
