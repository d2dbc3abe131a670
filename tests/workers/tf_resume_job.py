"""The Keras phases of the cross-job resume test (``tests/test_fault_tolerance.py``), run by
``resume_jobs.py``.

``full(DIR)``: ``model.fit`` for 7 epochs; after every epoch every rank writes a
``tf.train.Checkpoint`` of its model and optimizer (Accordion's state included), and at the
end its weights. ``resume(DIR)``: a new job restores the checkpoint of epoch 4 and fits the
rest. Variants: adaptive PowerSGD and TopK, and batch switching with 5 micro-batches per
epoch and 4 per large batch, restarted from the first epoch that ends inside a large batch.
"""
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import horovod_accordion.keras as hvd  # noqa: E402

RESTART_EPOCH, EPOCHS = 4, 7
VARIANTS = {
    "powersgd": dict(compression=hvd.Compression.powersgd(2, 1, min_compression_rate=0), window_steps=3, interval=2),
    "topk": dict(compression=hvd.Compression.topk(0.5, 0.1), window_steps=3, interval=2),
    "batch": dict(batch_switch=hvd.BatchSwitch(small_batch=8, multiplier=4), window_steps=2, interval=1),
}


def build(options):
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(32, activation="relu", input_shape=(16,)),
                                 tf_keras.layers.Dense(4)])
    optimizer = hvd.DistributedOptimizer(tf_keras.optimizers.SGD(0.1, momentum=0.9), **options)
    model.compile(optimizer=optimizer, loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, optimizer


def data():
    rng = np.random.RandomState(hvd.rank())
    x = rng.standard_normal((40, 16)).astype(np.float32)
    return x, np.abs(x[:, :4]).argmax(axis=1)


def fit(model, first_epoch, last_epoch, extra=()):
    decay = tf_keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.1 if epoch < 5 else 0.025)
    x, y = data()
    model.fit(x, y, batch_size=8, shuffle=False, initial_epoch=first_epoch, epochs=last_epoch, verbose=0,
              callbacks=[decay, hvd.AccordionCallback(), *extra])


class CheckpointEveryEpoch(tf_keras.callbacks.Callback):
    def __init__(self, prefix):
        super().__init__()
        self.prefix, self.pending = prefix, []

    def on_epoch_end(self, epoch, logs=None):
        tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer).write(f"{self.prefix}.epoch{epoch + 1}")
        state = self.model.optimizer.accordion_state
        self.pending.append(state._steps.pending_micro_batches if state.batch_switch else None)
        with open(self.prefix + ".json", "w") as stream:
            json.dump(self.pending, stream)


def restart_epoch(name, pending):
    """After how many epochs the second job starts."""
    if name != "batch":
        return RESTART_EPOCH
    return next((epoch for epoch, count in enumerate(pending, 1) if count and epoch < EPOCHS), RESTART_EPOCH)


def full(directory):
    for name, options in VARIANTS.items():
        model, optimizer = build(options)
        fit(model, 0, EPOCHS, [CheckpointEveryEpoch(os.path.join(directory, f"{name}.rank{hvd.rank()}"))])
        np.savez(os.path.join(directory, f"{name}.full.rank{hvd.rank()}.npz"), *model.get_weights())
        with open(os.path.join(directory, f"{name}.checks.rank{hvd.rank()}.json"), "w") as stream:
            json.dump(optimizer.accordion_state.stats()["checks"], stream)


def same_checks(directory, name, checks):
    """Whether the resumed run's check history is the uninterrupted run's, before the restart included."""
    with open(os.path.join(directory, f"{name}.checks.rank{hvd.rank()}.json")) as stream:
        return json.loads(json.dumps(checks)) == json.load(stream)


def resume(directory):
    report = {}
    for name, options in VARIANTS.items():
        prefix = os.path.join(directory, f"{name}.rank{hvd.rank()}")
        with open(prefix + ".json") as stream:
            pending = json.load(stream)
        start = restart_epoch(name, pending)
        model, optimizer = build(options)
        tf.train.Checkpoint(model=model, optimizer=optimizer).read(f"{prefix}.epoch{start}")
        fit(model, start, EPOCHS)
        state = optimizer.accordion_state
        with np.load(os.path.join(directory, f"{name}.full.rank{hvd.rank()}.npz")) as saved:
            uninterrupted = [saved[f"arr_{k}"] for k in range(len(saved.files))]
        report[name] = {"restart_epoch": start, "pending_micro_batches": pending[start - 1],
                        "bitwise_equal": all(np.array_equal(a, b) for a, b in zip(model.get_weights(), uninterrupted)),
                        "checks": len(state.stats()["checks"]), "steps": state._schedule.step,
                        "same_checks_as_uninterrupted": same_checks(directory, name, state.stats()["checks"])}
    report["rank0_only"] = resume_from_rank_zero(directory)
    with open(os.path.join(directory, f"resume.rank{hvd.rank()}.json"), "w") as stream:
        json.dump(report, stream)


def resume_from_rank_zero(directory):
    """Horovod's recipe: rank 0 alone reads its checkpoint; BroadcastGlobalVariablesCallback
    shares the weights and the optimizer shares Accordion's state when it creates it."""
    model, optimizer = build(VARIANTS["powersgd"])
    if hvd.rank() == 0:
        tf.train.Checkpoint(model=model, optimizer=optimizer).read(
            os.path.join(directory, f"powersgd.rank0.epoch{RESTART_EPOCH}"))
    fit(model, RESTART_EPOCH, EPOCHS, [hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    state = optimizer.accordion_state
    flat = np.concatenate([w.reshape(-1) for w in model.get_weights()])
    everyone = hvd.allgather(tf.constant(flat[None, :])).numpy()
    return {"levels": state.levels, "steps": state._schedule.step,
            "weights_identical_across_ranks": bool(np.array_equal(everyone[0], everyone[1]))}

