"""Keras 3 (TensorFlow 2.21's default Keras) on 2 real Horovod processes. The same process also
runs tf_keras, through ``horovod_accordion.tensorflow``'s optimizer, as the reference: both
Keras packages import side by side, whatever ``TF_USE_LEGACY_KERAS`` says."""
import os
import tempfile
import warnings

import keras
import numpy as np
import tensorflow as tf
import tf_keras
import horovod.tensorflow as horovod_tf

import horovod_accordion.keras3 as hvd
from horovod_accordion.tensorflow.keras_callback import AccordionCallbackMixin
from horovod_accordion.tensorflow.optimizer import DistributedOptimizer as Keras2DistributedOptimizer

DECAY_EPOCH = 6
EPOCHS = 9
STEPS_PER_EPOCH = 8  # 256 samples per rank, batches of 32


def setup():
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    assert not os.environ.get("TF_USE_LEGACY_KERAS"), "this launch is Keras 3's"
    return hvd.rank()


class Keras2AccordionCallback(AccordionCallbackMixin, tf_keras.callbacks.Callback):
    """horovod_accordion.keras.AccordionCallback, which that package only exports under TF_USE_LEGACY_KERAS=1."""
    schedule_type = tf_keras.optimizers.schedules.LearningRateSchedule


def initial_weights():
    """The same on every rank and for both Kerases: (16→32→16→4) kernels and biases."""
    rng = np.random.RandomState(0)
    shapes = [(16, 32), (32,), (32, 16), (16,), (16, 4), (4,)]
    return [(rng.standard_normal(s) * (0.3 if len(s) == 2 else 0.1)).astype(np.float32) for s in shapes]


def make_model(keras_module):
    layers = keras_module.layers
    model = keras_module.Sequential([keras_module.Input((16,)), layers.Dense(32, activation="relu"),
                                     layers.Dense(16, activation="relu"), layers.Dense(4)])
    model.set_weights(initial_weights())
    return model


def rank_dataset(samples=256):
    rng = np.random.RandomState(hvd.rank())
    x = rng.standard_normal((samples, 16)).astype(np.float32)
    y = (np.abs(x[:, :4]).argmax(axis=1)).astype(np.int64)
    return x, y


def identical_across_ranks(arrays):
    """In float64, which holds every float32 and integer counter exactly."""
    flat = np.concatenate([np.asarray(a, np.float64).reshape(-1) for a in arrays])
    everyone = horovod_tf.allgather(tf.constant(flat[None, :])).numpy()
    return np.array_equal(everyone[0], everyone[1])


def weights_identical_across_ranks(model):
    return identical_across_ranks(model.get_weights())


def adaptive_powersgd():
    return hvd.Compression.powersgd(2, 1, min_compression_rate=0)


def fit(keras_module, wrap, callback, epochs=EPOCHS, compression=None, interval=2, learning_rate=None,
        accordion=None, **compile_args):
    """``epochs`` of fit with a 10x LR decay at DECAY_EPOCH; the model, its optimizer, and the
    levels at each epoch end. ``learning_rate(keras_module)``: a schedule (its own decay) instead of 0.05;
    ``accordion``: more of DistributedOptimizer's arguments."""
    model = make_model(keras_module)
    rate = learning_rate(keras_module) if learning_rate else 0.05
    options = dict(accordion or {})
    if "batch_switch" not in options:
        options["compression"] = compression or adaptive_powersgd()
    optimizer = wrap(keras_module.optimizers.SGD(rate), interval=interval, **options)
    model.compile(optimizer=optimizer, loss=keras_module.losses.SparseCategoricalCrossentropy(from_logits=True),
                  **compile_args)
    levels = []

    class LevelRecorder(keras_module.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            levels.append(list(optimizer.accordion_state.levels.values()))

    # A LearningRateSchedule decays by itself; a float rate by the callback.
    decay = [] if learning_rate else [
        keras_module.callbacks.LearningRateScheduler(lambda e, lr: lr / 10 if e == DECAY_EPOCH else lr)]
    x, y = rank_dataset()
    model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[*decay, callback(), LevelRecorder()])
    return model, optimizer, levels


def check_fit_switches_both_ways_and_equals_the_tf_keras_path():
    model, optimizer, levels = fit(keras, hvd.DistributedOptimizer, hvd.AccordionCallback, jit_compile=False)
    assert weights_identical_across_ranks(model), "ranks hold different weights"
    everyone = horovod_tf.allgather_object(levels)
    assert everyone[0] == everyone[1], "ranks saw different levels"
    stats = optimizer.accordion_state.stats()
    decays = [c for c in stats["checks"] if c["event"] == "lr_decay"]
    # the decay epoch's first step carries the dropped rate (``core.rates``); the next decides
    assert len(decays) == 1 and decays[0]["step"] == DECAY_EPOCH * STEPS_PER_EPOCH + 1, stats["checks"]
    assert set(decays[0]["levels"].values()) == {2}, decays  # back to ℓ_low at the decay
    assert any(1 in epoch for epoch in levels[:DECAY_EPOCH]), levels  # ℓ_high before it
    assert len(stats["bytes_per_step"]) == EPOCHS * STEPS_PER_EPOCH
    # the same run through tf_keras and Horovod's tf_keras optimizer path
    reference, reference_optimizer, reference_levels = fit(tf_keras, Keras2DistributedOptimizer,
                                                           Keras2AccordionCallback)
    assert reference_levels == levels, (reference_levels, levels)
    assert reference_optimizer.accordion_state.stats()["bytes_per_step"] == stats["bytes_per_step"]
    differences = [float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), reference.get_weights())]
    assert all(d == 0 for d in differences), differences
    return {"levels": levels, "bytes": sum(stats["bytes_per_step"])}


def check_accumulation_schedules_and_batch_switching_equal_the_tf_keras_path():
    """What the tf_keras path tests at length, on Keras 3 through the same code: equal, bitwise."""
    variants = {
        "backward_passes_per_step=2": dict(accordion=dict(backward_passes_per_step=2)),
        "a PiecewiseConstantDecay schedule": dict(learning_rate=lambda k: k.optimizers.schedules.PiecewiseConstantDecay(
            [4 * STEPS_PER_EPOCH], [0.05, 0.005])),
        "batch_switch": dict(accordion=dict(batch_switch=hvd.BatchSwitch(small_batch=32, multiplier=2,
                                                                         warmup_steps=0))),
    }
    seen = {}
    for label, variant in variants.items():
        model, optimizer, levels = fit(keras, hvd.DistributedOptimizer, hvd.AccordionCallback, epochs=6,
                                       jit_compile=False, **variant)
        reference, reference_optimizer, reference_levels = fit(tf_keras, Keras2DistributedOptimizer,
                                                               Keras2AccordionCallback, epochs=6, **variant)
        assert weights_identical_across_ranks(model), label
        stats, reference_stats = optimizer.accordion_state.stats(), reference_optimizer.accordion_state.stats()
        assert levels == reference_levels, (label, levels, reference_levels)
        assert stats["bytes_per_step"] == reference_stats["bytes_per_step"], label
        assert [c["event"] for c in stats["checks"]] == [c["event"] for c in reference_stats["checks"]], label
        for a, b in zip(model.get_weights(), reference.get_weights()):
            np.testing.assert_array_equal(a, b, err_msg=label)
        seen[label] = {"levels": levels, "steps": len(stats["bytes_per_step"]),
                       "events": sorted({c["event"] for c in stats["checks"]})}
    # one micro-batch per step, then two: the batch size switched
    assert {1, 2} <= {level for epoch in seen["batch_switch"]["levels"] for level in epoch}, seen["batch_switch"]
    assert "lr_decay" in seen["a PiecewiseConstantDecay schedule"]["events"], seen
    return seen


def check_a_keras_checkpoint_resumes_bitwise_in_a_new_model():
    """Each rank saves its own ``.keras`` file: the error-feedback memory is per rank."""
    uninterrupted, _, levels = fit(keras, hvd.DistributedOptimizer, hvd.AccordionCallback, epochs=4, interval=1,
                                   jit_compile=False)
    first, _, first_levels = fit(keras, hvd.DistributedOptimizer, hvd.AccordionCallback, epochs=2, interval=1,
                                 jit_compile=False)
    path = os.path.join(tempfile.mkdtemp(), "model.keras")
    first.save(path)
    restored = hvd.load_model(path, compression=adaptive_powersgd(), interval=1)
    optimizer = restored.optimizer
    assert type(optimizer).__module__ == "horovod_accordion.keras3.optimizer", type(optimizer)
    assert int(optimizer.iterations.numpy()) == 2 * STEPS_PER_EPOCH
    resumed_levels = []

    class LevelRecorder(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            resumed_levels.append(list(optimizer.accordion_state.levels.values()))

    x, y = rank_dataset()
    restored.fit(x, y, batch_size=32, epochs=4, initial_epoch=2, shuffle=False, verbose=0,
                 callbacks=[hvd.AccordionCallback(), LevelRecorder()])
    assert first_levels + resumed_levels == levels, (first_levels, resumed_levels, levels)
    assert optimizer.accordion_state._schedule.detector.windows_seen == 4
    for a, b in zip(restored.get_weights(), uninterrupted.get_weights()):
        np.testing.assert_array_equal(a, b)
    return levels


def check_every_compression_kind_trains_in_fit_and_xla_compile_is_turned_off():
    x, y = rank_dataset(64)
    kinds = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
             "powersgd static": hvd.Compression.powersgd(2, min_compression_rate=0),
             "powersgd adaptive": adaptive_powersgd(),
             "topk static": hvd.Compression.topk(0.1), "topk adaptive": hvd.Compression.topk(0.5, 0.1)}
    sent = {}
    for label, compression in kinds.items():
        model = make_model(keras)
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=compression, interval=1)
        # Keras 3's default on a machine with a GPU; on a CPU it leaves XLA off.
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses = model.fit(x, y, batch_size=16, epochs=2, verbose=0,
                               callbacks=[hvd.AccordionCallback()]).history["loss"]
        assert losses[-1] < losses[0], (label, losses)
        assert any("XLA" in str(w.message) for w in caught), [str(w.message) for w in caught]
        assert not model.jit_compile
        assert weights_identical_across_ranks(model), label
        stats = optimizer.accordion_state.stats()
        checks = [c for c in stats["checks"] if c["event"] == "check"]
        assert len(checks) == (2 if "adaptive" in label else 0), (label, checks)
        sent[label] = sum(stats["bytes_per_step"])
    parameters = sum(w.size for w in initial_weights())
    assert sent["none"] == 8 * parameters * 4 and sent["fp16"] == 8 * parameters * 2, sent
    assert sent["powersgd static"] < sent["fp16"] and sent["topk static"] < sent["fp16"], sent
    return sent


def check_a_custom_loop_calling_apply_or_apply_gradients_averages():
    model = make_model(keras)
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=hvd.Compression.topk(0.5),
                                         window_steps=2)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = rank_dataset(64)

    def train_step(apply):
        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
            return loss
        return step

    by_apply = train_step(optimizer.apply)
    by_apply_gradients = train_step(lambda grads, variables: optimizer.apply_gradients(zip(grads, variables)))
    for k, start in enumerate(range(0, 64, 16)):
        (by_apply if k % 2 == 0 else by_apply_gradients)(x[start:start + 16], y[start:start + 16])
        optimizer.accordion_state.step_end()
    assert weights_identical_across_ranks(model), "apply() or apply_gradients() did not average"
    assert len(optimizer.accordion_state.stats()["bytes_per_step"]) == 4


def check_misuse_is_refused_with_the_fix():
    messages = []
    for make in (lambda: hvd.DistributedOptimizer(tf_keras.optimizers.SGD(0.1)),
                 lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)),
                 lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), num_groups=2),
                 lambda: hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))),
                 lambda: hvd.DistributedOptimizer(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)))):
        try:
            make()
        except ValueError as error:
            messages.append(str(error))
    assert len(messages) == 5, messages
    assert "horovod_accordion.keras" in messages[0], messages[0]
    assert "backward_passes_per_step=2" in messages[1], messages[1]
    assert "num_groups=2" in messages[2], messages[2]
    assert "LossScaleOptimizer" in messages[3], messages[3]
    assert "already a DistributedOptimizer" in messages[4], messages[4]
    # compile() wraps Accordion's optimizer in a LossScaleOptimizer under a mixed_float16 policy
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = make_model(keras)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x, y = rank_dataset(32)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[hvd.AccordionCallback()])
        raise AssertionError("fit ran under mixed_float16")
    except ValueError as error:
        assert "mixed precision" in str(error), error
    finally:
        keras.mixed_precision.set_global_policy("float32")


def optimizer_values(optimizer):
    return [np.array(v) for v in optimizer.variables]


def check_broadcast_gives_every_rank_the_root_model_and_optimizer_built_or_not():
    """Each rank starts from its own weights; after the broadcast, rank 0's. A model with an
    ``Input`` is built before fit, so the broadcast comes first; one without it, after batch 0."""
    x, y = rank_dataset(64)
    seen = {}
    for built in (True, False):
        keras.utils.set_random_seed(10 + hvd.rank())
        layers = [keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)]
        model = keras.Sequential([keras.Input((16,)), *layers] if built else layers)
        root_start = horovod_tf.broadcast_object([w.copy() for w in model.get_weights()], 0) if built else None
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                             compression=hvd.Compression.topk(0.5))
        model.compile(optimizer=optimizer, jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        first = {}

        class FirstWeights(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                first.setdefault(batch, [w.copy() for w in self.model.get_weights()])

        model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False,
                  callbacks=[hvd.BroadcastGlobalVariablesCallback(0), hvd.AccordionCallback(), FirstWeights()])
        if built:
            for mine, root in zip(first[0], root_start):
                np.testing.assert_array_equal(mine, root)
        assert identical_across_ranks(model.get_weights()), built
        assert identical_across_ranks(optimizer_values(optimizer)), built  # the momentum slots too
        seen[built] = float(np.abs(model.get_weights()[0]).sum())
    return seen


def check_load_model_wraps_a_plain_optimizer_with_its_slots():
    """A ``.keras`` file saved without Horovod (one process, a built-in optimizer) loads with the
    optimizer wrapped, its momentum restored, and trains on both ranks as one."""
    model = make_model(keras)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    x, y = rank_dataset(64)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    saved = optimizer_values(model.optimizer)
    path = os.path.join(tempfile.mkdtemp(), "plain.keras")
    model.save(path)
    restored = hvd.load_model(path, compression=hvd.Compression.powersgd(2, min_compression_rate=0))
    optimizer = restored.optimizer
    assert type(optimizer).__module__ == "horovod_accordion.keras3.optimizer", type(optimizer)
    for mine, loaded in zip(optimizer_values(optimizer), saved):
        np.testing.assert_array_equal(mine, loaded)
    restored.fit(x, y, batch_size=16, epochs=1, verbose=0,
                 callbacks=[hvd.BroadcastGlobalVariablesCallback(0), hvd.AccordionCallback()])
    assert identical_across_ranks(restored.get_weights())
    assert len(optimizer.accordion_state.stats()["bytes_per_step"]) == 4
    assert int(optimizer.iterations.numpy()) == 8
