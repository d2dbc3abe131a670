"""``tests/workers/gpu_checks.py`` for TensorFlow: ``AccordionState`` on variables on GPU r,
collectives through NCCL, against the same training on the CPU in the same process.
``ACCORDION_TEST_DEVICE=cpu`` runs them on the CPU only."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import tensorflow as tf
import tf_keras

import horovod_accordion.tensorflow as hvd

DEVICE = os.environ.get("ACCORDION_TEST_DEVICE", "cuda")
COMPRESSIONS = {
    "none": lambda: hvd.Compression.none,
    "fp16": lambda: hvd.Compression.fp16,
    "powersgd 2/1": lambda: hvd.Compression.powersgd(2, 1, min_compression_rate=0),
    "topk 0.5/0.1": lambda: hvd.Compression.topk(0.5, 0.1),
}


def setup():
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    if DEVICE == "cuda":
        gpus = tf.config.list_physical_devices("GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)  # the other rank needs its GPU too
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    return hvd.rank()


def train(device, compression, steps=12):
    with tf.device(device):
        tf_keras.utils.set_random_seed(0)
        model = tf_keras.Sequential([tf_keras.layers.Dense(32, activation="relu", input_shape=(20,)),
                                     tf_keras.layers.Dense(24, activation="relu"), tf_keras.layers.Dense(4)])
        optimizer = tf_keras.optimizers.SGD(0.05, momentum=0.9)
        state = hvd.AccordionState(model.trainable_variables, compression=compression, window_steps=2, interval=1)
        loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            tape = hvd.DistributedGradientTape(tape, accordion=state)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

        for k in range(steps):
            rng = np.random.RandomState(1000 * hvd.rank() + k)
            x = (rng.standard_normal((16, 20)) * (10.0 if k >= 6 else 1.0)).astype(np.float32)
            step(tf.constant(x), tf.constant(rng.randint(0, 4, 16)))
            state.step_end()
    return model, state


def check_every_compression_on_the_device_matches_the_cpu():
    device = "/GPU:0" if DEVICE == "cuda" else "/CPU:0"
    report = {}
    for name, compression in COMPRESSIONS.items():
        model, state = train(device, compression())
        reference, reference_state = train("/CPU:0", compression())
        tolerance = 1e-3 if name == "fp16" else 1e-4
        for v, w in zip(model.trainable_variables, reference.trainable_variables):
            assert ("GPU" if DEVICE == "cuda" else "CPU") in v.device, (name, v.name, v.device)
            error = float(np.linalg.norm(v.numpy() - w.numpy()) / np.linalg.norm(w.numpy()))
            assert error <= tolerance, f"{name}, {v.name}: GPU and CPU differ, relative error {error:.2e}"
        total = np.array([float(tf.reduce_sum(tf.cast(v, tf.float64))) for v in model.trainable_variables])
        assert np.array_equal(hvd.broadcast(tf.constant(total), 0, name=f"gpu.{name}").numpy(), total), name
        # The levels by position: the second model's variables have other names.
        levels = [list(check["levels"].values()) for check in state.stats()["checks"]]
        assert levels == [list(check["levels"].values()) for check in reference_state.stats()["checks"]], name
        report[name] = {"checks": len(levels), "bytes": state.stats()["total_bytes_sent"]}
    return report
