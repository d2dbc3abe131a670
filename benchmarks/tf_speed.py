"""Seconds per step of a Keras ResNet-50 (CIFAR shapes) with our ``DistributedGradientTape``
against Horovod's, on real ranks: does the TF path cost more than stock Horovod?

    horovodrun -np 2 --gloo python benchmarks/tf_speed.py --out benchmarks/results/speed_tf_resnet50.json

``benchmarks/speed.sh`` runs it on the unlimited link. Every variant is a ``tf.function``
step, built once and timed in interleaved rounds, as in ``speed.py``.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf
import tf_keras
import horovod.tensorflow as horovod

import horovod_accordion.tensorflow as hvd

BATCH = 16


def variant(kind, compression=None):
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)
    optimizer = tf_keras.optimizers.SGD(0.01, momentum=0.9)
    state = hvd.AccordionState(model.trainable_variables, compression=compression) if kind == "ours" else None
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=False)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        if kind == "horovod":
            tape = horovod.DistributedGradientTape(tape)
        elif kind == "ours":
            tape = hvd.DistributedGradientTape(tape, accordion=state)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return model, state, step


VARIANTS = {
    "compute only": ("local",),
    "stock horovod tape": ("horovod",),
    "ours none": ("ours", hvd.Compression.none),
    "ours powersgd r1": ("ours", hvd.Compression.powersgd(1)),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out")
    parser.add_argument("--command")
    args = parser.parse_args()
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    built = {name: variant(*spec) for name, spec in VARIANTS.items()}
    times = {name: [] for name in VARIANTS}
    rng = tf.random.Generator.from_seed(hvd.rank())
    for _ in range(args.rounds):
        for name, (_, state, step) in built.items():
            horovod.allreduce(tf.zeros(1), name="speed.barrier")
            for k in range(args.warmup + args.steps):
                x = rng.normal((BATCH, 32, 32, 3))
                y = rng.uniform((BATCH,), 0, 10, dtype=tf.int64)
                started = time.perf_counter()
                float(step(x, y))  # waits for the step
                if state is not None:
                    state.step_end()
                if k >= args.warmup:
                    times[name].append(time.perf_counter() - started)
            if hvd.rank() == 0:
                print(f"tf {name}: {statistics.median(times[name][-args.steps:]):.3f} s/step", flush=True)
    if hvd.rank() == 0 and args.out:
        results = {name: {"median_step_s": round(statistics.median(t), 4),
                          "round_medians_s": [round(statistics.median(t[r * args.steps:(r + 1) * args.steps]), 4)
                                              for r in range(args.rounds)]}
                   for name, t in times.items()}
        for name, (_, state, _) in built.items():
            if state is not None:
                results[name]["bytes_per_step"] = state.accordion_stats()["bytes_per_step"][-1]
        with open(args.out, "w") as stream:
            json.dump({"command": args.command or " ".join([sys.executable] + sys.argv),
                       "model": "keras resnet50 (32x32x3, 10 classes)", "batch_per_rank": BATCH,
                       "ranks": hvd.size(), "link": "unlimited loopback",
                       "machine": f"{platform.machine()}, {os.cpu_count()} cores, TF {tf.__version__}, "
                                  f"1 intra-op and 1 inter-op thread per rank, Gloo",
                       "timing": f"median of {args.rounds} rounds x {args.steps} timed steps, {args.warmup} "
                                 f"warm-up steps per round, all variants interleaved in one job",
                       "variants": results}, stream, indent=2)


if __name__ == "__main__":
    main()
