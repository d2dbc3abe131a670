"""Horovod's own behaviours on our TensorFlow drop-in, used the way Horovod 0.28.1's
``test/parallel/test_tensorflow.py`` uses them, on 2 real ranks: an ``AccordionState`` of a
process set this rank is not in, and Horovod's private names."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import tensorflow as tf
import horovod.tensorflow as horovod

import horovod_accordion.tensorflow as hvd


def setup():
    hvd.init()  # with HOROVOD_DYNAMIC_PROCESS_SETS=1, as Horovod's tests add their sets
    tf.config.threading.set_intra_op_parallelism_threads(1)
    return hvd.rank()


def check_a_state_of_a_process_set_this_rank_is_not_in_trains_without_a_hang():
    """Rank 1 builds the state of the set {0}, which Horovod allows: its gradients stay its own, as
    Horovod's tape leaves them; the state's construction raised on it and the job hung."""
    evens = hvd.add_process_set([0])
    for compression in (hvd.Compression.none, hvd.Compression.powersgd(2, 1, min_compression_rate=0)):
        weights = tf.Variable(np.full((6, 4), 0.5, np.float32))
        state = hvd.AccordionState([weights], compression=compression, process_set=evens, window_steps=2,
                                   interval=1)
        x = tf.constant(np.full((3, 6), 1.0 + hvd.rank(), np.float32))
        for _ in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.matmul(x, weights) ** 2)
            tape = hvd.DistributedGradientTape(tape, accordion=state)
            (grad,) = tape.gradient(loss, [weights])
            with tf.GradientTape() as local:
                local_loss = tf.reduce_sum(tf.matmul(x, weights) ** 2)
            if hvd.rank() == 1:
                np.testing.assert_array_equal(grad.numpy(), local.gradient(local_loss, [weights])[0].numpy())
            state.step_end()
    horovod.allreduce(tf.zeros(1), name="compat.barrier")
    hvd.remove_process_set(evens)


def check_horovods_private_names_resolve():
    assert hvd._executing_eagerly() == horovod._executing_eagerly()
    for name in ("_allreduce", "_DistributedOptimizer", "_executing_eagerly"):
        assert getattr(hvd, name) is getattr(horovod, name), name
