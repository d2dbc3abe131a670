"""``mpirun -np 4``: Horovod initialised on an mpi4py communicator, with two process sets
built from ``MPI.COMM_WORLD.Split``. Each set trains its own model with adaptive PowerSGD
(``verify_levels`` on), on data of its own, in torch or in TensorFlow (``AccordionState``
with ``process_set=``). Used by ``tests/test_mpi4py.py``; each rank writes ``DIR/rank<r>.json``.

    mpirun -np 4 --oversubscribe python -m tests.workers.mpi4py_process_sets_job torch|tensorflow DIR
"""
import json
import os
import sys

import numpy as np
from mpi4py import MPI

STEPS = 24


def batch(rank, color, step):
    """Only set 1's data changes regime (inputs ×10 from step 8), so the sets decide apart."""
    rng = np.random.RandomState(1000 * rank + step)
    scale = 10.0 if color == 1 and step >= 8 else 1.0
    return (rng.standard_normal((16, 20)) * scale).astype(np.float32), rng.randint(0, 4, 16)


def train_torch(world, color):
    import torch
    import horovod_accordion.torch as hvd
    from tests.workers.torch_checks import make_model

    own = hvd.ProcessSet(world.Split(color=color, key=world.rank))  # each rank passes its own half
    hvd.init(comm=world, process_sets=[own])
    torch.set_num_threads(1)
    model = make_model(seed=color)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.powersgd(2, 1, min_compression_rate=0),
                                         process_set=own, window_steps=2, interval=1, verify_levels=True)
    for step in range(STEPS):
        x, y = batch(world.rank, color, step)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        optimizer.step()
    checks = [check["levels"] for check in optimizer.accordion_stats()["checks"]]
    result = describe(own, checks, [float(p.detach().double().sum()) for p in model.parameters()])
    hvd.barrier()  # a rank that exits shuts Horovod down for the other set too
    return result


def train_tensorflow(world, color):
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf
    import tf_keras
    import horovod_accordion.tensorflow as hvd

    own = hvd.ProcessSet(world.Split(color=color, key=world.rank))
    hvd.init(comm=world, process_sets=[own])
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf_keras.utils.set_random_seed(color)
    model = tf_keras.Sequential([tf_keras.layers.Dense(32, activation="relu", input_shape=(20,)),
                                 tf_keras.layers.Dense(4)])
    optimizer = tf_keras.optimizers.SGD(0.1)
    accordion = hvd.AccordionState(model.trainable_variables,
                                   compression=hvd.Compression.powersgd(2, 1, min_compression_rate=0),
                                   process_set=own, window_steps=2, interval=1, verify_levels=True)
    hvd.broadcast_variables(model.variables, root_rank=own.ranks[0], process_set=own)
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, accordion=accordion)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    for step in range(STEPS):
        train_step(*batch(world.rank, color, step))
        accordion.step_end()  # outside tf.function: closes a window every 2 steps
    checks = [list(check["levels"].values()) if isinstance(check["levels"], dict) else check["levels"]
              for check in accordion.stats()["checks"]]
    result = describe(own, checks, [float(tf.reduce_sum(tf.cast(v, tf.float64))) for v in model.trainable_variables])
    hvd.allreduce(tf.constant(0.0), name="exit")  # horovod.tensorflow has no barrier()
    return result


def describe(own, checks, weights):
    return {"set_ranks": own.ranks, "set_rank": own.rank(), "checks": checks, "weights": weights}


def main(framework, directory):
    world = MPI.COMM_WORLD
    color = world.rank % 2  # set 0: ranks 0 and 2; set 1: ranks 1 and 3
    result = {"torch": train_torch, "tensorflow": train_tensorflow}[framework](world, color)
    with open(os.path.join(directory, f"rank{world.rank}.json"), "w") as stream:
        json.dump(dict(result, set=color), stream)


if __name__ == "__main__":
    main(*sys.argv[1:3])
