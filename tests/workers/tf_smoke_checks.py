"""The TensorFlow half of the stack on real ranks: allreduce, and a tf_keras fit."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd_keras
import tf_keras

from tests.workers.tf_checks import setup  # noqa: F401  (they share tf_checks' launch)


def check_tensorflow_allreduce():
    summed = hvd_tf.allreduce(tf.constant([hvd_tf.rank() + 1.0]), op=hvd_tf.Sum)
    assert summed.numpy().tolist() == [3.0]
    averaged = hvd_tf.allreduce(tf.constant([float(hvd_tf.rank())] * 3))
    assert averaged.numpy().tolist() == [0.5] * 3


def check_tf_keras_fit_with_horovod_distributed_optimizer():
    assert tf_keras.__version__.startswith("2."), tf_keras.__version__
    rng = np.random.default_rng(hvd_tf.rank())
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(16, activation="relu", input_shape=(8,)),
                                 tf_keras.layers.Dense(1, activation="sigmoid")])
    optimizer = hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.1))
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0,
                        callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
    losses = history.history["loss"]
    assert losses[-1] < losses[0], losses
    weights = np.concatenate([w.reshape(-1) for w in model.get_weights()])
    everyone = hvd_tf.allgather(tf.constant(weights[None, :])).numpy()
    assert np.array_equal(everyone[0], everyone[1]), "ranks hold different weights"
    return losses
