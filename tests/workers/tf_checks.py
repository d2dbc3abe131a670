"""Accordion on TensorFlow and tf_keras, on every rank of a real ``horovodrun -np 2`` job."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import tensorflow as tf
import tf_keras
import torch
import horovod.tensorflow as horovod_tf
import horovod.torch as horovod_torch

import horovod_accordion.keras as hvd_keras
import horovod_accordion.tensorflow as hvd
from horovod_accordion.core.batch import BatchSwitch
from horovod_accordion.core.reducers import PowerSGDReducer, QuantizedReducer, TopKReducer
from horovod_accordion.tensorflow.ops import TensorFlowCollectives
from horovod_accordion.tensorflow.tensors import TensorFlowTensorOps
from horovod_accordion.torch.ops import TorchCollectives
from horovod_accordion.torch_common.tensors import TorchTensorOps
from tests.workers.models import Float64State
from tests.workers.policy_reference import assert_policy_checks, reference_costs, set_regime
from tests.workers.quantized_checks import SHAPES as SHAPES_OF_QUANTIZED, two_shot_matches_the_float64_reference


def setup():
    hvd.init()
    horovod_torch.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    torch.set_num_threads(1)
    return hvd.rank()


# The TF shapes; a 4-D one is a Keras conv kernel (kh, kw, in, out), which TF compresses as the
# (kh·kw·in) × out matrix. torch gets each gradient as the matrix TF compresses, so both
# frameworks run the same maths on the same matrices.
SHAPES = [(16, 12), (12,), (3, 3, 2, 8), (5, 40)]
TORCH_SHAPES = [(16, 12), (12,), (18, 8), (5, 40)]


def rank_gradients(step):
    rng = np.random.RandomState(100 * hvd.rank() + step)
    return [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]


class Float64TorchTensors(Float64State, TorchTensorOps):
    """The torch reducer's maths and state in fp64."""


class Float64TensorFlowTensors(TensorFlowTensorOps):
    """The TF reducer's maths and state in fp64."""

    def state(self, array, name):
        return tf.Variable(array.astype(np.float64), trainable=False, name=name)

    def as_matrix(self, grad, shape):
        return tf.reshape(tf.cast(tf.convert_to_tensor(grad), tf.float64), shape)


def torch_backends(tensors=None):
    """Tensor maths (fp32 unless given) and Horovod's torch collectives."""
    tensors = tensors or TorchTensorOps()
    return tensors, TorchCollectives(tensors, horovod_torch.global_process_set)


def tf_backends(tensors=None):
    tensors = tensors or TensorFlowTensorOps()
    return tensors, TensorFlowCollectives(tensors, horovod_tf.global_process_set)


def run_both(make_reducer, levels_per_step, tensors=(TorchTensorOps, TensorFlowTensorOps), dtype=np.float32):
    """The same gradients, seeds and levels through the torch and the TF reducer."""
    torch_reducer = make_reducer(torch_backends(tensors[0]()), TORCH_SHAPES)
    tf_reducer = make_reducer(tf_backends(tensors[1]()), SHAPES)
    for step, levels in enumerate(levels_per_step):
        torch_reducer.set_levels(levels)
        tf_reducer.set_levels(levels)
        grads = [g.astype(dtype) for g in rank_gradients(step)]
        torch_out = torch_reducer.reduce([torch.from_numpy(g.reshape(s)) for g, s in zip(grads, TORCH_SHAPES)])
        tf_out = tf_reducer.reduce([tf.constant(g) for g in grads])
        for layer, (a, b) in enumerate(zip(torch_out, tf_out)):
            assert_agree(a.numpy().reshape(b.shape), b.numpy(), f"step {step}, layer {layer}: decompressed gradients")
        for group, entries in torch_reducer.state().items():
            for i, holder in entries.items():
                if group in ("memory", "residual"):  # Q's column signs depend on the QR routine
                    assert_agree(holder.numpy(), tf_reducer.state()[group][i].numpy(), f"step {step}: {group} {i}")


def assert_agree(ours, theirs, what):
    """Relative (Frobenius) error below 1e-5. TopK selects and copies entries, so the
    frameworks agree exactly up to fp32 summation order (~1e-7). PowerSGD's matmul and QR
    kernels round differently in each framework, and error feedback carries it from step
    to step, which in fp32 reached 1.22e-5 on one CPU: its check runs in fp64, where the
    same gap is ~1e-13, so 1e-5 holds by construction on any CPU."""
    error = np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-30)
    assert error <= 1e-5, f"{what} differ: relative error {error:.2e}"


def check_cross_framework_powersgd_equivalence():
    config = hvd.Compression.powersgd(low_rank=3, high_rank=1, min_compression_rate=0)
    # ranks 3,3 then a switch to 1, then back to 3: the warm start survives both ways
    levels = [[3] * 4] * 2 + [[1] * 4] * 2 + [[3] * 4] * 2
    run_both(lambda backends, shapes: PowerSGDReducer(shapes, config, *backends), levels,
             tensors=(Float64TorchTensors, Float64TensorFlowTensors), dtype=np.float64)


def check_a_keras_conv_kernel_is_compressed_as_kh_kw_in_by_out():
    """(3, 3, 64, 128) is the 576 × 128 matrix, as torch's (128, 64, 3, 3) is 128 × 576, and a
    1×1 kernel is 64 × 128: at rank 1 each sends n + m floats for P and Q."""
    tensors, collectives = tf_backends()
    shapes = [(3, 3, 64, 128), (1, 1, 64, 128)]
    reducer = PowerSGDReducer(shapes, hvd.Compression.powersgd(1), tensors, collectives)
    assert [tuple(reducer.memory[i].shape) for i in reducer.compressed] == [(576, 128), (64, 128)]
    reducer.reduce([tf.ones(shape) for shape in shapes])
    sent = collectives.take_traffic().handed
    assert sent == 4 * (576 + 128 + 64 + 128), sent
    return sent


def check_cross_framework_topk_equivalence():
    config = hvd.Compression.topk(0.7, 0.1)
    levels = [[0.7] * 4] * 2 + [[0.1] * 4] * 3 + [[0.7] * 4]
    run_both(lambda backends, shapes: TopKReducer(shapes, config, *backends), levels)


LADDERS = (hvd.Compression.powersgd(4, 1, ladder=(4, 2, 1), min_compression_rate=0),
           hvd.Compression.topk(0.5, 0.05, ladder=(0.5, 0.2, 0.05)))


def check_the_policies_error_tables_and_costs_agree_across_frameworks():
    """The torch and the TF reducer measure the same errors on the same Δ, in fp64."""
    for config, make in zip(LADDERS, (PowerSGDReducer, TopKReducer)):
        torch_reducer = make(TORCH_SHAPES, config, *torch_backends(Float64TorchTensors()))
        tf_reducer = make(SHAPES, config, *tf_backends(Float64TensorFlowTensors()))
        deltas = [g.astype(np.float64) for g in rank_gradients(0)]
        ours = torch_reducer.approximation_errors([torch.from_numpy(g.reshape(s)) for g, s in zip(deltas, TORCH_SHAPES)],
                                                  config.levels).numpy()
        theirs = tf_reducer.approximation_errors([tf.constant(g) for g in deltas], config.levels).numpy()
        np.testing.assert_allclose(ours, theirs, rtol=1e-9, err_msg=repr(config))
        assert torch_reducer.level_costs(config.levels) == tf_reducer.level_costs(config.levels)


class StepLevels(tf_keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.levels = []

    def on_train_batch_end(self, batch, logs=None):
        self.levels.append(dict(self.model.optimizer.accordion_state.levels))


def check_level_policies_in_keras_fit_decide_as_the_reference_on_every_rank():
    """Issue 21 through tf_keras: the same decisions as the reference, on both ranks."""
    middles = []
    for policy, compression in zip((hvd.ErrorBudget(slack=2.0), hvd.PhaseSchedule(total_windows=5)), LADDERS):
        model = make_keras_model()
        optimizer = hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.05), compression=compression,
                                                   window_steps=2, interval=1, lr_decay_factor=None, policy=policy)
        model.compile(optimizer=optimizer, loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        recorder = StepLevels()
        x, y = rank_dataset(320)
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0), hvd_keras.AccordionCallback(),
                             recorder])
        everyone = horovod_tf.allgather_object(recorder.levels)
        assert everyone[0] == everyone[1], f"{policy!r}: the ranks' levels differ"
        state = optimizer.accordion_state
        names = state._schedule.layer_names
        costs = reference_costs(zip(names, [v.shape for v in model.trainable_variables]), compression, hvd.size())
        middles.append(assert_policy_checks(policy, state.stats()["checks"], compression.levels, costs,
                                            recorder.levels[0]))
    assert all(middles), f"checks that used a middle level, per run: {middles}"
    return middles


def make_keras_model():
    tf_keras.utils.set_random_seed(0)
    return tf_keras.Sequential([tf_keras.layers.Dense(32, activation="relu", input_shape=(16,)),
                                tf_keras.layers.Dense(16, activation="relu"),
                                tf_keras.layers.Dense(4)])


def rank_dataset(samples=256):
    rng = np.random.RandomState(hvd.rank())
    x = rng.standard_normal((samples, 16)).astype(np.float32)
    y = (np.abs(x[:, :4]).argmax(axis=1)).astype(np.int64)
    return x, y


def weights_identical_across_ranks(model):
    flat = np.concatenate([w.reshape(-1) for w in model.get_weights()])
    everyone = horovod_tf.allgather(tf.constant(flat[None, :])).numpy()
    return np.array_equal(everyone[0], everyone[1])


class LevelRecorder(tf_keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.levels = []

    def on_epoch_end(self, epoch, logs=None):
        self.levels.append(list(self.model.optimizer.accordion_state.levels.values()))


def check_keras_fit_levels_agree_and_step_decay_switches_to_low():
    model = make_keras_model()
    # Horovod's warm-up momentum correction needs the momentum as a variable: legacy optimizers.
    optimizer = hvd_keras.DistributedOptimizer(tf_keras.optimizers.legacy.SGD(0.05, momentum=0.9),
                                               compression=hvd.Compression.powersgd(2, 1, min_compression_rate=0),
                                               interval=2)
    model.compile(optimizer=optimizer,
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    recorder = LevelRecorder()
    decay_epoch = 6
    callbacks = [
        hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd_keras.callbacks.MetricAverageCallback(),
        hvd_keras.callbacks.LearningRateWarmupCallback(initial_lr=0.05, warmup_epochs=1, verbose=0),
        tf_keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr / 10 if epoch == decay_epoch else lr),
        hvd_keras.AccordionCallback(),
        recorder,
    ]
    x, y = rank_dataset()
    history = model.fit(x, y, batch_size=32, epochs=9, callbacks=callbacks, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0], losses
    assert weights_identical_across_ranks(model), "ranks hold different weights"
    everyone = horovod_tf.allgather_object(recorder.levels)
    assert everyone[0] == everyone[1], "ranks saw different levels"
    stats = optimizer.accordion_state.stats()
    decays = [c for c in stats["checks"] if c["event"] == "lr_decay"]
    assert len(decays) == 1, stats["checks"]
    # the decay fired at the second batch of the decay epoch, once the first carried the rate:
    # every layer at ℓ_low from then
    assert set(decays[0]["levels"].values()) == {2}, decays
    assert decays[0]["step"] == decay_epoch * 8 + 1, decays
    assert any(1 in levels for levels in recorder.levels[:decay_epoch]), recorder.levels  # ℓ_high before
    assert len(stats["bytes_per_step"]) == 9 * 8
    # the Keras optimizer checkpoint carries the Accordion state with it
    import tempfile
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(os.path.join(tempfile.mkdtemp(), "ckpt"))
    saved = {name for name, _ in tf.train.list_variables(path)}
    for key in optimizer.accordion_state.reducer_variables:
        assert any(f"reducer_variables/{key}/" in name for name in saved), (key, sorted(saved)[:20])
    assert any("schedule_json" in name for name in saved), sorted(saved)
    return recorder.levels


def check_custom_loop_tape_under_tf_function_does_not_retrace_on_switch():
    model = make_keras_model()
    model.build((None, 16))
    optimizer = tf_keras.optimizers.SGD(0.05)
    optimizer.build(model.trainable_variables)  # else creating its variables traces twice
    state = hvd.AccordionState(model.trainable_variables, compression=hvd.Compression.topk(0.5, 0.1),
                               window_steps=2, interval=1)
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    traces = []

    @tf.function
    def train_step(x, y):
        traces.append(1)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, accordion=state)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    x, y = rank_dataset(64)
    horovod_tf.broadcast_variables(model.variables, root_rank=0)
    levels, losses = [], []
    for step in range(12):
        losses.append(float(train_step(x[:32], y[:32])))
        state.step_end()
        levels.append(list(state.levels.values()))
    assert len(traces) == 1, f"traced {len(traces)} times"
    assert len({tuple(level) for level in levels}) > 1, levels  # the levels did switch
    assert losses[-1] < losses[0], losses
    assert weights_identical_across_ranks(model)
    everyone = horovod_tf.allgather_object(levels)
    assert everyone[0] == everyone[1]
    return {"traces": len(traces), "levels": levels}


def check_a_checkpoint_of_the_other_batch_switch_setting_is_refused_once_and_leaves_the_state_as_it_was():
    """Saved with a batch switch, restored without (their ladders alike: one micro-batch, rank 1):
    the schedule loaded, then the count raised, and so did every later use of the state."""
    import tempfile
    import pytest
    variables = [tf.Variable(tf.zeros(shape)) for shape in SHAPES]
    config = hvd.Compression.powersgd(1, min_compression_rate=0)
    switching = hvd.AccordionState(variables, compression=config, batch_switch=BatchSwitch(8, 1), window_steps=1)
    for micro_batch in range(3):
        switching.begin_micro_batch(0.1)
        switching.add_micro_batch([tf.constant(g) for g in rank_gradients(micro_batch)])
        switching.reduce_pending()
        switching.end_micro_batch()
    path = tf.train.Checkpoint(accordion=switching).save(os.path.join(tempfile.mkdtemp(), "ckpt"))
    plain = hvd.AccordionState(variables, compression=config, window_steps=1)
    before = plain._schedule.state_dict()
    tf.train.Checkpoint(accordion=plain).restore(path).expect_partial()
    with pytest.raises(ValueError, match="batch_switch"):
        plain.levels
    assert plain._schedule.state_dict() == before and plain.accordion_stats()["checks"] == []
    return switching._schedule.step


def check_checkpoint_round_trip_restores_levels_memory_and_detector():
    for config in (hvd.Compression.powersgd(2, 1, min_compression_rate=0), hvd.Compression.quantized(4)):
        checkpoint_round_trip_restores_levels_memory_and_detector(config)


def checkpoint_round_trip_restores_levels_memory_and_detector(config):
    import tempfile
    variables = [tf.Variable(tf.zeros(shape)) for shape in SHAPES]
    state = hvd.AccordionState(variables, compression=config, window_steps=1, interval=1)
    for step in range(4):
        state.reduce([tf.constant(g) for g in rank_gradients(step)])
        state.step_end()
    directory = tempfile.mkdtemp()
    path = tf.train.Checkpoint(accordion=state).save(os.path.join(directory, "ckpt"))
    restored = hvd.AccordionState(variables, compression=config, window_steps=1, interval=1)
    tf.train.Checkpoint(accordion=restored).restore(path).assert_consumed()
    assert restored.levels == state.levels
    # the check history comes back too (issue 18: it used to restart empty)
    assert restored.stats()["checks"] == state.stats()["checks"] and restored._schedule.step == state._schedule.step
    for key, variable in state.reducer_variables.items():
        np.testing.assert_array_equal(variable.numpy(), restored.reducer_variables[key].numpy(), err_msg=key)
    for step in range(4, 7):
        grads = [tf.constant(g) for g in rank_gradients(step)]
        a, b = state.reduce(grads), restored.reduce(grads)
        state.step_end()
        restored.step_end()
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.numpy(), y.numpy())
        assert restored.levels == state.levels


def check_bad_tensorflow_configuration_raises_before_any_collective():
    variables = [tf.Variable(tf.zeros((4, 4)))]
    cases = [
        lambda: hvd.AccordionState(variables, compression="powersgd"),
        lambda: hvd.AccordionState(variables, compression=hvd.Compression.topk(0.5, 0.1), eta=0),
        lambda: hvd.AccordionState(variables, compression=hvd.Compression.topk(0.5), op=hvd.Adasum),
        lambda: hvd.Compression.cast(tf.bfloat16),
        lambda: hvd_keras.DistributedOptimizer(object(), compression=hvd.Compression.topk(0.5)),
        lambda: hvd.DistributedGradientTape(tf.GradientTape(), compression=hvd.Compression.topk(0.5)),
        # Horovod's own arguments that Accordion's Keras optimizer has no use for: never dropped silently
        lambda: hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=hvd.Compression.topk(0.5),
                                               num_groups=2),
        lambda: hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=hvd.Compression.none,
                                               log_path=os.devnull, scale_local_gradients=False),
        # A policy with one level to choose from: refused when wrapping, not ignored nor raised at the first step
        lambda: hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=hvd.Compression.none,
                                               policy="error_budget"),
        lambda: hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=hvd.Compression.powersgd(2),
                                               policy=hvd.PhaseSchedule(total_windows=3)),
        lambda: hvd.AccordionState(variables, compression=hvd.Compression.topk(0.1), policy="error_budget"),
        # A traced TF step keeps the bits it was traced with: switching bits is refused, not ignored
        lambda: hvd.AccordionState(variables, compression=hvd.Compression.quantized(8, 4)),
        lambda: hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                               compression=hvd.Compression.quantized(8, 4)),
    ]
    if hvd.rank() == 1:  # a collective entered by rank 1 alone would hang this check
        for case in cases:
            try:
                case()
            except ValueError:
                continue
            raise AssertionError("a bad configuration did not raise ValueError")
    assert float(horovod_tf.allreduce(tf.ones([1]), op=horovod_tf.Sum)[0]) == 2.0


def check_callback_reads_a_learning_rate_schedule():
    model = make_keras_model()
    schedule = tf_keras.optimizers.schedules.PiecewiseConstantDecay(boundaries=[20], values=[0.05, 0.005])
    optimizer = hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(schedule),
                                               compression=hvd.Compression.topk(0.5, 0.1), interval=1)
    model.compile(optimizer=optimizer, loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = rank_dataset()
    model.fit(x, y, batch_size=32, epochs=4, callbacks=[hvd_keras.AccordionCallback()], verbose=0)
    decays = [c for c in optimizer.accordion_state.stats()["checks"] if c["event"] == "lr_decay"]
    # the schedule drops after optimizer step 20: step 21 carries the new rate (``core.rates``), and
    # the decay is decided before step 22
    assert [(d["step"], round(d["lr"], 6)) for d in decays] == [(22, 0.005)], decays
    assert set(decays[0]["levels"].values()) == {0.5}


def keras_batch_switch_optimizer(lr, switch, **kwargs):
    return hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(lr), batch_switch=switch, **kwargs)


def check_keras_batch_switch_accumulated_micro_batches_equal_one_large_step():
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    accumulated, large = make_keras_model(), make_keras_model()
    optimizer = keras_batch_switch_optimizer(0.1, BatchSwitch(small_batch=8, multiplier=4, warmup_steps=0))
    state = optimizer.accordion_state_for(accumulated.trainable_variables)
    with state._python_state():
        set_regime(state._schedule, [False] * len(accumulated.trainable_variables))  # large batch
    x, y = rank_dataset(32)

    @tf.function
    def micro_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, accumulated(x, training=True))
        grads = tape.gradient(loss, accumulated.trainable_variables)
        optimizer.apply_gradients(zip(grads, accumulated.trainable_variables))

    for micro in range(4):
        state.begin_micro_batch(0.1)
        micro_step(x[8 * micro:8 * micro + 8], y[8 * micro:8 * micro + 8])
        state.end_micro_batch()
    assert state.stats()["steps_extra"] == [{"micro_batches": 4, "lr_factor": 4.0}]
    reference = tf_keras.optimizers.SGD(0.4)  # linear scaling
    with tf.GradientTape() as tape:
        loss = loss_fn(y, large(x, training=True))
    tape = hvd.DistributedGradientTape(tape)
    reference.apply_gradients(zip(tape.gradient(loss, large.trainable_variables), large.trainable_variables))
    for a, b in zip(accumulated.get_weights(), large.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def check_keras_batch_switch_follows_the_controller():
    model = make_keras_model()
    optimizer = keras_batch_switch_optimizer(0.01, BatchSwitch(small_batch=8, multiplier=4, warmup_steps=2),
                                             interval=1)
    model.compile(optimizer=optimizer, loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = rank_dataset(128)  # 16 micro-batches of 8 per epoch
    bytes_per_epoch = []

    class EpochTraffic(tf_keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.before = optimizer.accordion_state.stats()["total_bytes_sent"]

        def on_epoch_end(self, epoch, logs=None):
            # runs before AccordionCallback's window, so this is step traffic only
            bytes_per_epoch.append(optimizer.accordion_state.stats()["total_bytes_sent"] - self.before)

    callbacks = [tf_keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr / 10 if epoch == 3 else lr),
                 EpochTraffic(), hvd_keras.AccordionCallback()]
    model.fit(x, y, batch_size=8, epochs=4, shuffle=False, callbacks=callbacks, verbose=0)
    stats = optimizer.accordion_state.stats()
    steps = stats["steps_extra"]
    # epochs 0-1: small batch (the first checks), 2: large with LR warm-up, 3: the large batch that
    # carries the decayed rate (``core.rates``), then small after the decay
    assert [s["micro_batches"] for s in steps] == [1] * 32 + [4] * 5 + [1] * 12, steps
    assert [s["lr_factor"] for s in steps] == [1.0] * 32 + [2.0, 3.0, 4.0, 4.0, 4.0] + [1.0] * 12, steps
    assert bytes_per_epoch[2] * 4 == bytes_per_epoch[1], bytes_per_epoch
    checks = [c for c in stats["checks"] if c["event"] == "check"]
    assert [c["global_batch"] for c in checks] == [16, 64, 64, 64], checks
    assert int(optimizer.iterations.numpy()) == 49
    assert weights_identical_across_ranks(model)
    everyone = horovod_tf.allgather_object({"steps": steps, "checks": checks})
    assert everyone[0] == everyone[1], "ranks disagree on the batch size"
    return bytes_per_epoch


def check_keras_tensorboard_scalars_from_the_callback():
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    import tempfile
    # A new directory: the reader reads every event file in it, a stale run's too.
    logdir = os.path.join(tempfile.mkdtemp(prefix="accordion-keras-tb-"), "logs")
    model = make_keras_model()
    optimizer = hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.05),
                                               compression=hvd.Compression.topk(0.5, 0.1), interval=1)
    model.compile(optimizer=optimizer, loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = rank_dataset(64)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0,
              callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd_keras.AccordionCallback(tensorboard_dir=logdir)])
    if hvd.rank() != 0:
        assert not os.path.exists(logdir)
        return None
    events = EventAccumulator(logdir, size_guidance={"tensors": 0})
    events.Reload()
    # tf.summary writes scalars as tensors: TensorBoard's reader lists them under "tensors"
    values = {tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]
              for tag in events.Tags()["tensors"]}
    stats = optimizer.accordion_state.stats()
    assert [v for _, v in values["accordion/bytes_per_step"]] == stats["bytes_per_step"]
    assert [s for s, _ in values["accordion/bytes_per_step"]] == list(range(1, 9))
    name = next(iter(stats["levels"]))
    import pytest
    expected = [pytest.approx(c["levels"][name], rel=1e-6) for c in stats["checks"]]  # stored as fp32
    assert [v for _, v in values[f"accordion/level/{name}"]] == expected
    return sorted(values)


def check_keras_none_and_fp16_with_a_log_path_record_their_traffic_and_train_as_horovod():
    """R11: a plain baseline asked for a record used to get Horovod's own optimizer, which
    dropped log_path and tensorboard_dir with a warning and recorded nothing."""
    import json
    import tempfile
    x, y = rank_dataset(64)
    weights = {}
    for compression, bytes_per_value in ((hvd.Compression.none, 4), (hvd.Compression.fp16, 2), (None, None)):
        model = make_keras_model()
        log_path = os.path.join(tempfile.mkdtemp(prefix="accordion-keras-plain-"), "log.jsonl")
        if compression is None:  # Horovod's own, the reference
            optimizer = hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.05))
        else:
            optimizer = hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.05), compression=compression,
                                                       log_path=log_path)
        model.compile(optimizer=optimizer, loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=16, epochs=1, verbose=0,
                  callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0), hvd_keras.AccordionCallback()])
        assert weights_identical_across_ranks(model)
        weights[bytes_per_value] = np.concatenate([w.reshape(-1) for w in model.get_weights()])
        if compression is None:
            continue
        parameters = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
        assert optimizer.accordion_state.stats()["bytes_per_step"] == [bytes_per_value * parameters] * 4
        if hvd.rank() == 0:
            with open(log_path) as log:
                steps = [json.loads(line) for line in log if '"step"' in line]
            assert [s["bytes_sent"] for s in steps if s["event"] == "step"] == [bytes_per_value * parameters] * 4
    # Averaging fp32 gradients through our allreduce is Horovod's own average: the same weights.
    np.testing.assert_allclose(weights[4], weights[None], rtol=0, atol=1e-6)
    return {"parameters": parameters}


def check_a_non_finite_gradient_leaves_tensorflow_state_clean():
    """As on torch: one inf on rank 1 at step 1 leaves layer 0's memory, Q or residual as it
    was on every rank, that step's layer-0 average is non-finite, and later steps are finite."""
    for make in (lambda backends: PowerSGDReducer(SHAPES, hvd.Compression.powersgd(2, 1, min_compression_rate=0),
                                                  *backends),
                 lambda backends: TopKReducer(SHAPES, hvd.Compression.topk(0.5, 0.1), *backends),
                 lambda backends: QuantizedReducer(SHAPES, hvd.Compression.quantized(4), *backends)):
        reducer = make(tf_backends())
        for step in range(4):
            grads = rank_gradients(step)
            if step == 1 and hvd.rank() == 1:
                grads[0][0, 0] = np.inf
            before = {(g, i): v.numpy().copy() for g, e in reducer.state().items() for i, v in e.items()}
            outputs = [o.numpy() for o in reducer.reduce([tf.constant(g) for g in grads])]
            finite = [bool(np.isfinite(o).all()) for o in outputs]
            assert finite == ([False, True, True, True] if step == 1 else [True] * 4), (step, finite)
            if step == 1:
                for (group, layer), value in before.items():
                    if layer == 0:
                        now = reducer.state()[group][layer].numpy()
                        assert np.array_equal(now, value), (group, layer)


def check_keras_backward_passes_per_step_two_sums_locally_and_applies_every_second_call():
    """As Horovod's: the first call changes nothing; the second applies the rank average of
    the two calls' sum (full-rank PowerSGD is exact, so plain SGD is the reference)."""
    for average in (False, True):
        model = make_keras_model()
        optimizer = hvd_keras.DistributedOptimizer(
            tf_keras.optimizers.SGD(0.1), compression=hvd.Compression.powersgd(64, 1, min_compression_rate=0),
            backward_passes_per_step=2, average_aggregated_gradients=average)
        before = model.get_weights()
        grads = [[tf.constant(np.random.RandomState(10 * hvd.rank() + k + j).standard_normal(v.shape), tf.float32)
                  for j, v in enumerate(model.trainable_variables)] for k in range(2)]
        optimizer.apply_gradients(zip(grads[0], model.trainable_variables))
        for a, b in zip(model.get_weights(), before):
            np.testing.assert_array_equal(a, b)
        optimizer.apply_gradients(zip(grads[1], model.trainable_variables))
        for k, (a, b) in enumerate(zip(model.get_weights(), before)):
            total = horovod_tf.allreduce(grads[0][k] + grads[1][k], op=horovod_tf.Average).numpy()
            expected = b - 0.1 * total / (2 if average else 1)
            np.testing.assert_allclose(a, expected, atol=2e-5, rtol=0, err_msg=f"variable {k}, average={average}")
    # And under fit: 8 batches are 4 steps, the ranks agree.
    model = make_keras_model()
    optimizer = hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.05),
                                               compression=hvd.Compression.topk(0.5, 0.1),
                                               backward_passes_per_step=2, window_steps=2, interval=1)
    model.compile(optimizer=optimizer, loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = rank_dataset(64)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, callbacks=[hvd_keras.AccordionCallback()], verbose=0)
    assert int(optimizer.iterations.numpy()) == 4 and optimizer.accordion_state._schedule.step == 4
    assert weights_identical_across_ranks(model)


def check_keras_batch_switch_without_the_callback_is_a_clear_error():
    model = make_keras_model()
    model.compile(optimizer=keras_batch_switch_optimizer(0.01, BatchSwitch(small_batch=8, multiplier=4)),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = rank_dataset(32)
    try:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    except RuntimeError as error:
        assert "AccordionCallback" in str(error), error
        return str(error)
    raise AssertionError("fit with batch_switch and no AccordionCallback ran")


def check_tensorflow_non_finite_warning_names_the_variable_and_integer_variables_are_refused():
    import warnings
    variables = [tf.Variable(tf.zeros(shape), name=f"layer{k}") for k, shape in enumerate(SHAPES)]
    state = hvd.AccordionState(variables, compression=hvd.Compression.topk(0.5, 0.1), window_steps=2,
                               interval=1, verify_levels=True)
    caught_all = []
    for step in range(4):
        grads = rank_gradients(step)
        if step == 1 and hvd.rank() == 1:
            grads[3][0, 0] = np.nan
        state.reduce([tf.constant(g) for g in grads])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state.step_end()
        caught_all += [str(w.message) for w in caught if "non-finite" in str(w.message)]
    if hvd.rank() == 1:
        assert len(caught_all) == 1 and "'layer3:0' (1 steps)" in caught_all[0], caught_all
    else:
        assert caught_all == [], caught_all
    try:
        hvd.AccordionState([tf.Variable(tf.zeros((3, 3), tf.int32))], compression=hvd.Compression.powersgd(1))
    except TypeError as error:
        assert "real floating-point" in str(error) and "int32" in str(error), error
        return caught_all + [str(error)]
    raise AssertionError("an integer variable was accepted")


def check_load_model_brings_back_accordions_optimizer_and_from_keras_files_its_state():
    import tempfile
    compression = hvd.Compression.powersgd(2, 1, min_compression_rate=0)
    model = make_keras_model()
    model.compile(optimizer=hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.05, momentum=0.9),
                                                           compression=compression, interval=1),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = rank_dataset(64)

    def fit(m):
        m.fit(x, y, batch_size=16, epochs=1, shuffle=False, callbacks=[hvd_keras.AccordionCallback()], verbose=0)

    fit(model)
    fit(model)  # two windows: the first check has been made
    loaded = {}
    for suffix in (".keras", ".h5"):
        path = os.path.join(tempfile.mkdtemp(), "model" + suffix)
        model.save(path)
        restored = hvd_keras.load_model(path, compression=compression, interval=1)
        optimizer = restored.optimizer
        assert type(optimizer).__module__ == "horovod_accordion.tensorflow.optimizer", type(optimizer)
        assert int(optimizer.iterations.numpy()) == 8, int(optimizer.iterations.numpy())
        fit(restored)
        assert weights_identical_across_ranks(restored)
        loaded[suffix] = {"accordion_steps": optimizer.accordion_state._schedule.step,
                          "checks": optimizer.accordion_state._schedule.detector.windows_seen,
                          "weights": restored.get_weights()}
    fit(model)
    # .keras carries Accordion's state: the same run as never saving; .h5 starts it afresh.
    assert (loaded[".keras"]["accordion_steps"], loaded[".keras"]["checks"]) == (12, 3), loaded[".keras"]
    assert all(np.array_equal(a, b) for a, b in zip(loaded[".keras"]["weights"], model.get_weights()))
    assert (loaded[".h5"]["accordion_steps"], loaded[".h5"]["checks"]) == (4, 1), loaded[".h5"]
    return {suffix: {k: v for k, v in outcome.items() if k != "weights"} for suffix, outcome in loaded.items()}


def traced_reduce(state, count):
    @tf.function
    def step(grads):
        count[0] += 1  # runs only while tracing
        return state.reduce(grads)
    return step


def check_delta_is_summed_only_in_windows_that_feed_a_check():
    """As in torch: with a check every 3 windows, the traced step adds to Δ in the window before
    each check only, read from a variable at run time. It added at every step of every window."""
    variables = [tf.Variable(tf.zeros(shape)) for shape in SHAPES]
    state = hvd.AccordionState(variables, compression=hvd.Compression.powersgd(2, 1), window_steps=1, interval=3)
    count = [0]
    step = traced_reduce(state, count)
    summed = []
    for k in range(7):
        step([tf.constant(g) for g in rank_gradients(k)])
        summed.append(any(float(tf.reduce_sum(tf.abs(total))) > 0 for total in state.accumulated))
        state.step_end()
    assert (summed, count[0]) == ([True, False, False, True, False, False, True], 1), (summed, count)
    assert len(state.accordion_stats()["checks"]) == 3
    return summed


def check_topk_wire_switches_inside_one_traced_step():
    """TopK 0.99 goes through the allreduce and 0.1 as values and indices, chosen in the
    graph from the level variable: one trace, and the same results as forcing either way."""
    variables = [tf.Variable(tf.zeros(shape)) for shape in SHAPES]
    results, traces = {}, {}
    for wire in ("auto", "sparse"):
        state = hvd.AccordionState(variables, compression=hvd.Compression.topk(0.99, 0.1, wire=wire))
        count = [0]
        step = traced_reduce(state, count)

        outputs = []
        for k, fraction in enumerate([0.99, 0.1, 0.1, 0.99]):
            state._reducer.set_levels([fraction] * len(SHAPES))
            outputs.append([o.numpy() for o in step([tf.constant(g) for g in rank_gradients(k)])])
            state.step_end()
        results[wire], traces[wire] = outputs, count[0]
    assert traces == {"auto": 1, "sparse": 1}, traces
    for a, b in zip(results["auto"], results["sparse"]):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, atol=1e-6, rtol=0)
    return traces


def check_quantized_two_shot_matches_the_float64_reference():
    """Through Horovod's TF alltoall and allgather, eagerly, where the bits of each step are read
    (``tests/workers/quantized_checks.py``)."""
    return two_shot_matches_the_float64_reference(tf_backends()[1], as_tensor=tf.constant)


def check_quantized_two_shot_in_a_traced_step_matches_the_float64_reference():
    """The same in one ``tf.function``, traced once, at the one level TF takes: every shape is
    static there, and the owner memory's parts are variable slices assigned in the graph."""
    return two_shot_matches_the_float64_reference(tf_backends()[1], as_tensor=tf.constant,
                                                  schedule=[[4] * len(SHAPES_OF_QUANTIZED)] * 8, traced=tf.function)
