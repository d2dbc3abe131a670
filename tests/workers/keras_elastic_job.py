"""A Keras ``hvd.elastic.run`` job for ``tests/test_fault_tolerance.py``: the Keras twin of
``elastic_job.py``. ``model.fit`` with Horovod's elastic callbacks (a commit every 2 batches)
and ``AccordionCallback``; rank 1 kills itself after the commit of epoch 1, batch 3, once;
a new worker joins after the blacklist cooldown. Each worker appends its batches, commits,
resets and final weights to ``DIR/worker.<pid>.jsonl``.
"""
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import horovod_accordion.keras as hvd  # noqa: E402

EPOCHS, KILL_AT = 10, (1, 3)


def memory_norm(state):
    """Of the error feedback: PowerSGD's memory or TopK's residuals."""
    return float(np.sqrt(sum(np.square(v.numpy()).sum() for k, v in state.reducer_variables.items()
                             if k.startswith(("memory", "residual")))))


class Record(tf_keras.callbacks.Callback):
    """After CommitStateCallback: logs each batch, each commit, and makes the one failure."""

    def __init__(self, state, write, killed):
        super().__init__()
        self.state, self.write, self.killed = state, write, killed

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.before = memory_norm(self.accordion)

    def on_train_batch_end(self, batch, logs=None):
        self.write(event="batch", epoch=self.epoch, batch=batch, rank=hvd.rank(), size=hvd.size(),
                   accordion_step=self.accordion._schedule.step, memory_norm_before=self.before,
                   levels=list(self.accordion.levels.values()),
                   bytes_sent=self.accordion.accordion_stats()["bytes_per_step"][-1])
        if (batch + 1) % 2 == 0:
            self.write(event="commit", epoch=self.epoch, batch=batch, accordion_step=self.accordion._schedule.step,
                       memory_norm=memory_norm(self.accordion))
        if hvd.rank() == 1 and (self.epoch, batch) == KILL_AT and not os.path.exists(self.killed):
            open(self.killed, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.3)  # slow enough for a new worker to join mid-training

    @property
    def accordion(self):
        return self.model.optimizer.accordion_state


# PowerSGD 2/1 averaged; or static TopK 90 % summed, whose wire way (sparse or dense) and sum
# depend on the world size, which must not stay frozen in the traced step across resets.
VARIANTS = {
    "powersgd": dict(compression=hvd.Compression.powersgd(2, 1, min_compression_rate=0)),
    "topk-sum": dict(compression=hvd.Compression.topk(0.9), op=hvd.Sum),
}


def main(directory, variant="powersgd"):
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(32, activation="relu", input_shape=(16,)),
                                 tf_keras.layers.Dense(4)])
    optimizer = hvd.DistributedOptimizer(tf_keras.optimizers.legacy.SGD(0.05, momentum=0.9),
                                         window_steps=4, interval=1, verify_levels=True, **VARIANTS[variant])
    model.compile(optimizer=optimizer, loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    log = open(os.path.join(directory, f"worker.{os.getpid()}.jsonl"), "a", buffering=1)

    def write(**record):
        log.write(json.dumps(record) + "\n")

    state.register_reset_callbacks([lambda: write(event="reset", size=hvd.size(), rank=hvd.rank())])

    @hvd.elastic.run
    def train(state):
        rng = np.random.RandomState(hvd.rank())
        x = rng.standard_normal((64, 16)).astype(np.float32)
        y = np.abs(x[:, :4]).argmax(axis=1)
        model.fit(x, y, batch_size=8, shuffle=False, initial_epoch=state.epoch, epochs=EPOCHS, verbose=0,
                  callbacks=[hvd.AccordionCallback(), hvd.elastic.UpdateEpochStateCallback(state),
                             hvd.elastic.UpdateBatchStateCallback(state),
                             hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
                             Record(state, write, os.path.join(directory, "killed"))])

    train(state)
    write(event="done", epoch=state.epoch, rank=hvd.rank(), size=hvd.size(),
          weights=[float(w.astype(np.float64).sum()) for w in model.get_weights()])


if __name__ == "__main__":
    main(*sys.argv[1:3])
