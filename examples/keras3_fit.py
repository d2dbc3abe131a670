"""Accordion on Keras 3 ``model.fit`` (TensorFlow 2.21's default Keras): an MLP on the
embedded digits dataset.

    horovodrun -np 2 --gloo python examples/keras3_fit.py

As ``keras_fit.py`` for tf_keras, with ``import horovod_accordion.keras3 as hvd``: Horovod's own
Keras integration fails under Keras 3 (horovod#4290), and this module does not need it. TopK
keeps 99 % of each layer's gradient (ℓ_low) in critical regimes and 10 % (ℓ_high) elsewhere;
the LR drops 10x at ``--decay-epoch``.
"""
import argparse
import os

# Most of TensorFlow's C++ log lines (oneDNN, CUDA probing); not the few it writes before reading it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod_accordion.keras3 as hvd  # noqa: E402
from example_data import digits_shards  # noqa: E402
from horovod_accordion.examples.runs import announce  # noqa: E402
from progress import epochs_bar, show  # noqa: E402

COMPRESSIONS = {
    "accordion-topk": hvd.Compression.topk(0.99, 0.1), "accordion": hvd.Compression.powersgd(2, 1),
    "none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
    "rank1": hvd.Compression.powersgd(1), "topk": hvd.Compression.topk(0.1),
    "quantized": hvd.Compression.quantized(4),  # one level: a traced TF step keeps its bits
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--decay-epoch", type=int, default=8)
    parser.add_argument("--interval", type=int, default=2)
    parser.add_argument("--compression", nargs="+", choices=sorted(COMPRESSIONS), default=["accordion-topk"],
                        help="one or more: each trains from the same start in turn, in this one launch")
    args = parser.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    for compression in args.compression:
        train(args, compression)


def train(args, compression):
    announce(hvd.rank(), compression)
    keras.backend.clear_session()  # each run's layers are named as the first's
    keras.utils.set_random_seed(0)
    x_train, y_train, x_test, y_test = digits_shards(hvd.rank(), hvd.size())
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9),
                                         compression=COMPRESSIONS[compression], interval=args.interval)
    # Horovod's collectives are not XLA ops: Keras 3 would otherwise compile with XLA.
    model.compile(optimizer=optimizer, metrics=["accuracy"], jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    bar = epochs_bar(args.epochs, hvd.rank())

    class PrintLevels(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            state = optimizer.accordion_state
            show(bar, logs["loss"], state.accordion_stats()["total_bytes_sent"], state.levels)
            if hvd.rank() == 0:
                levels = "  ".join(f"{name.split('/')[-2]}={level:g}" for name, level in state.levels.items()) \
                    or f"none ({compression} compresses no layer)"  # and biases are never compressed
                bar.write(f"[rank 0] epoch {epoch}: loss {logs['loss']:.4f}  level per layer: {levels}")
            bar.update()

    callbacks = [
        hvd.BroadcastGlobalVariablesCallback(0),
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr / 10 if epoch == args.decay_epoch else lr),
        hvd.AccordionCallback(),
        PrintLevels(),
    ]
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks, verbose=0)
    bar.close()
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if hvd.rank() == 0:
        sent = optimizer.accordion_state.accordion_stats()["total_bytes_sent"]
        print(f"[rank 0] {compression}: test accuracy {accuracy:.3f}; bytes sent per rank {sent}", flush=True)


if __name__ == "__main__":
    main()
