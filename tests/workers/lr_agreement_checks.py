"""The seams a reviewer found in the whole package (issue 34), on 2 real ranks, torch and TF."""
import os
import warnings

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf
import torch

import horovod_accordion.torch as hvd
from horovod_accordion.torch import BatchSwitch, Compression
from tests.workers.models import make_model
from tests.workers.policy_reference import set_regime
from tests.workers.seam_checks import setup  # noqa: F401 - the runner calls it: Horovod for torch and TF
from tests.workers.torch_checks import assert_same_on_all_ranks, rank_batch


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


# Item 10: rank 0's rate drops 10x at step 4, rank 1's at step 8, as a ReduceLROnPlateau stepped
# on each rank's own loss would. The detector must see one rate on every rank: the largest, so the
# decay comes at step 8, on both ranks at once.
RANK_DECAY_STEPS = (4, 8)


def rank_lr(step):
    return 0.01 if step >= RANK_DECAY_STEPS[hvd.rank()] else 0.1


def assert_one_decay_at_the_last_ranks_step(checks):
    decays = [(c["step"], c["lr"]) for c in checks if c["event"] == "lr_decay"]
    assert decays == [(max(RANK_DECAY_STEPS), 0.01)], decays
    return decays


def check_ranks_whose_learning_rates_differ_switch_together_torch():
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1, min_compression_rate=0),
                                         window_steps=2, interval=1, verify_levels=True)
    for step in range(12):
        for group in optimizer.param_groups:
            group["lr"] = rank_lr(step)
        train_steps(model, optimizer, 1, first=step)
    return assert_one_decay_at_the_last_ranks_step(optimizer.accordion_stats()["checks"])


def check_ranks_whose_learning_rates_differ_switch_together_tensorflow():
    import numpy as np
    import horovod_accordion.tensorflow as hvd_tf

    generator = np.random.default_rng(hvd_tf.rank())
    weights = tf.Variable(np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32))
    state = hvd_tf.AccordionState([weights], compression=hvd_tf.Compression.powersgd(2, 1, min_compression_rate=0),
                                  window_steps=2, interval=1, verify_levels=True)

    @tf.function
    def train_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.matmul(x, weights)))
        [grad] = hvd_tf.DistributedGradientTape(tape, accordion=state).gradient(loss, [weights])
        weights.assign_sub(0.01 * grad)

    for step in range(12):
        state.observe_lr(rank_lr(step))
        train_step(tf.constant(generator.standard_normal((4, 8)).astype(np.float32)))
        state.step_end()
    return assert_one_decay_at_the_last_ranks_step(state.accordion_stats()["checks"])


def check_the_rate_is_agreed_once_per_step_whatever_calls_observe_it():
    """Each rank agrees once per step, whether its first observation comes from a gradient hook,
    from ``synchronize()`` (a bucket that no hook started: a branch only rank 0 runs) or from
    ``step()`` after an explicit ``synchronize()``: one more on one rank was a deadlock."""
    from horovod_accordion.torch import ops
    from tests.workers.torch_checks import Mixed

    agree_max, agreements = ops.TorchCollectives.agree_max, []

    def counted(collectives, value, name):
        agreements.append(value)
        return agree_max(collectives, value, name)

    def run(model, width, explicit_synchronize):
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters(),
                                             compression=Compression.powersgd(2, 1, min_compression_rate=0),
                                             window_steps=2, interval=1)
        agreements.clear()
        for step in range(3):
            x, _ = rank_batch(step)
            optimizer.zero_grad()
            model(x[:, :width]).float().square().mean().backward()
            if explicit_synchronize:
                optimizer.synchronize()
                with optimizer.skip_synchronize():
                    optimizer.step()
            else:
                optimizer.step()
        return len(agreements)

    ops.TorchCollectives.agree_max = counted
    try:
        counts = {name: run(model, width, explicit) for name, model, width, explicit in (
            ("hooks", make_model(), 20, False), ("explicit synchronize", make_model(), 20, True),
            ("a branch rank 0 alone runs", Mixed(), 8, False))}
    finally:
        ops.TorchCollectives.agree_max = agree_max
    assert counts == {"hooks": 3, "explicit synchronize": 3, "a branch rank 0 alone runs": 3}, counts
    return counts
