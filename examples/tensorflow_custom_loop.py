"""Accordion in a TF2 custom training loop with ``DistributedGradientTape`` under ``tf.function``.

    TF_USE_LEGACY_KERAS=1 horovodrun -np 2 --gloo python examples/tensorflow_custom_loop.py

The ``AccordionState`` is created once, outside the traced step; level switches are
variable assignments, so the step is traced once (the script prints the trace count).
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# Most of TensorFlow's C++ log lines (oneDNN, CUDA probing); not the few it writes before reading it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import horovod_accordion.tensorflow as hvd  # noqa: E402
from example_data import digits_shards  # noqa: E402
from progress import epochs_bar, show  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--decay-epoch", type=int, default=6)
    parser.add_argument("--interval", type=int, default=2)
    args = parser.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf_keras.utils.set_random_seed(0)
    x_train, y_train, x_test, y_test = digits_shards(hvd.rank(), hvd.size())
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(args.batch_size, drop_remainder=True)
    model = tf_keras.Sequential([tf_keras.layers.Dense(128, activation="relu", input_shape=(64,)),
                                 tf_keras.layers.Dense(64, activation="relu"), tf_keras.layers.Dense(10)])
    optimizer = tf_keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9)
    optimizer.build(model.trainable_variables)
    accordion = hvd.AccordionState(model.trainable_variables, compression=hvd.Compression.powersgd(2, 1),
                                   interval=args.interval)
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    traces = 0

    @tf.function
    def train_step(x, y):
        nonlocal traces
        traces += 1
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, accordion=accordion)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    hvd.broadcast_variables(model.variables, root_rank=0)
    bar = epochs_bar(args.epochs, hvd.rank())
    for epoch in bar:
        if epoch == args.decay_epoch:
            optimizer.learning_rate.assign(optimizer.learning_rate * 0.1)
        accordion.observe_lr(float(optimizer.learning_rate))
        losses = [float(train_step(x, y)) for x, y in dataset]
        accordion.end_epoch()
        levels = " ".join(str(level) for level in accordion.levels.values())
        show(bar, sum(losses) / len(losses), accordion.accordion_stats()["total_bytes_sent"], accordion.levels)
        bar.write(f"[rank {hvd.rank()}] epoch {epoch}: loss {sum(losses) / len(losses):.4f}  "
                  f"PowerSGD rank per variable: {levels}")
    accuracy = float(tf.reduce_mean(tf.cast(tf.argmax(model(x_test), 1) == y_test, tf.float32)))
    stats = accordion.accordion_stats()
    print(f"[rank {hvd.rank()}] test accuracy {accuracy:.3f}; traced {traces} time(s); "
          f"bytes sent {stats['total_bytes_sent']}", flush=True)


if __name__ == "__main__":
    main()
