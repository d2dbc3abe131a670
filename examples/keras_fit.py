"""Accordion on tf_keras ``model.fit``: an MLP on the embedded digits dataset.

    TF_USE_LEGACY_KERAS=1 horovodrun -np 2 --gloo python examples/keras_fit.py

The only Horovod-facing changes from a plain Horovod Keras script are the import line
and ``AccordionCallback``. TopK keeps 99 % of each layer's gradient (ℓ_low) in critical
regimes and 10 % (ℓ_high) elsewhere; the LR drops 10x at ``--decay-epoch``.
``--batch-switch M`` switches the batch size instead: ``--batch-size`` in critical regimes,
M times larger elsewhere (M micro-batches per communication).
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# Most of TensorFlow's C++ log lines (oneDNN, CUDA probing); not the few it writes before reading it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import horovod_accordion.keras as hvd  # noqa: E402
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
    parser.add_argument("--batch-switch", type=int, metavar="M", help="switch the batch size, not the compression")
    args = parser.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    for compression in args.compression:
        train(args, compression)


def train(args, compression):
    announce(hvd.rank(), compression)
    tf_keras.backend.clear_session()  # each run's layers are named as the first's
    tf_keras.utils.set_random_seed(0)
    x_train, y_train, x_test, y_test = digits_shards(hvd.rank(), hvd.size())
    model = tf_keras.Sequential([tf_keras.layers.Dense(128, activation="relu", input_shape=(64,)),
                                 tf_keras.layers.Dense(64, activation="relu"), tf_keras.layers.Dense(10)])
    if args.batch_switch:
        accordion = dict(batch_switch=hvd.BatchSwitch(small_batch=args.batch_size, multiplier=args.batch_switch))
    else:
        accordion = dict(compression=COMPRESSIONS[compression])
    optimizer = hvd.DistributedOptimizer(tf_keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9),
                                         interval=args.interval, **accordion)
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    # Compression.none and fp16 give Horovod's own optimizer, which has no Accordion state.
    state = (lambda: optimizer.accordion_state) if hasattr(type(optimizer), "accordion_state") else (lambda: None)
    bar = epochs_bar(args.epochs, hvd.rank())

    class PrintLevels(tf_keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if state() is None:
                show(bar, logs["loss"])
                bar.write(f"[rank {hvd.rank()}] epoch {epoch}: loss {logs['loss']:.4f}")
            else:
                show(bar, logs["loss"], state().accordion_stats()["total_bytes_sent"], state().levels)
                if hvd.rank() == 0:
                    levels = "  ".join(f"{name.split('/')[-2]}={level:g}"  # biases are never compressed
                                       for name, level in state().levels.items() if "kernel" in name)
                    what = "micro-batches per step" if args.batch_switch else "level per layer"
                    bar.write(f"[rank 0] epoch {epoch}: loss {logs['loss']:.4f}  {what}: {levels}")
            bar.update()

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        tf_keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr / 10 if epoch == args.decay_epoch else lr),
        hvd.AccordionCallback(),
        PrintLevels(),
    ]
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks, verbose=0)
    bar.close()
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if hvd.rank() == 0:
        traffic = "" if state() is None else f"; bytes sent per rank {state().accordion_stats()['total_bytes_sent']}"
        print(f"[rank 0] {compression}: test accuracy {accuracy:.3f}{traffic}", flush=True)


if __name__ == "__main__":
    main()
