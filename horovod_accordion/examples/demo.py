"""The smallest Accordion run: an MLP on synthetic data, PowerSGD rank 2 in critical regimes, rank 1 elsewhere.

    horovodrun -np 2 python -m horovod_accordion.examples.demo                          # PyTorch
    horovodrun -np 2 python -m horovod_accordion.examples.demo --framework tensorflow   # Keras (tf_keras) model.fit

It needs only the wheel's ``torch`` or ``tensorflow`` extra and the patched Horovod
(``python -m horovod_accordion.tools.install_horovod``). ``examples/`` in the repository has the
full-size versions, with every compression and the comparison runs.
"""
import argparse
import importlib
import os
import sys

from horovod_accordion.examples.data import CLASSES, FEATURES, synthetic_shards


def train_torch(args):
    import torch

    import horovod_accordion.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = (torch.from_numpy(a) for a in synthetic_shards(hvd.rank(), hvd.size()))
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02 * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.powersgd(low_rank=2, high_rank=1),
                                         interval=args.interval)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=decay_epoch(args), gamma=0.1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    sent = 0
    for epoch in range(args.epochs):
        for batch in torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch)).split(32):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x_train[batch]), y_train[batch]).backward()
            optimizer.step()
        ran_at = optimizer.accordion_stats()  # the levels of this epoch, before its check moves them
        scheduler.step()
        optimizer.end_epoch()  # closes a detection window
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        sent = report_epoch(hvd, epoch, accuracy, ran_at, sent)
    report_end(hvd, accuracy, optimizer.accordion_stats())


def train_tensorflow(args):
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf
    import tf_keras

    import horovod_accordion.keras as hvd

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf_keras.utils.set_random_seed(0)
    x_train, y_train, x_test, y_test = synthetic_shards(hvd.rank(), hvd.size())
    model = tf_keras.Sequential([tf_keras.layers.Dense(64, activation="relu", input_shape=(FEATURES,)),
                                 tf_keras.layers.Dense(CLASSES)])
    optimizer = hvd.DistributedOptimizer(tf_keras.optimizers.SGD(0.02 * hvd.size(), momentum=0.9),
                                         compression=hvd.Compression.powersgd(low_rank=2, high_rank=1),
                                         interval=args.interval)
    model.compile(optimizer=optimizer, loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    class ReportEpochs(tf_keras.callbacks.Callback):
        """Placed before AccordionCallback, whose check at the epoch's end moves the levels."""
        sent = 0

        def on_epoch_end(self, epoch, logs=None):
            _, accuracy = model.evaluate(x_test, y_test, verbose=0)
            self.sent = report_epoch(hvd, epoch, accuracy, optimizer.accordion_state.accordion_stats(), self.sent)

    def step_decay(epoch, lr):
        return lr / 10 if epoch == decay_epoch(args) else lr

    model.fit(x_train, y_train, batch_size=32, epochs=args.epochs, verbose=0, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0), tf_keras.callbacks.LearningRateScheduler(step_decay),
        ReportEpochs(),
        hvd.AccordionCallback()])  # feeds the rate to the decay rule, closes a window at each epoch's end
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    report_end(hvd, accuracy, optimizer.accordion_state.accordion_stats())


def decay_epoch(args):
    return max(1, args.epochs * 3 // 4)


def report_epoch(hvd, epoch, accuracy, ran_at, sent_before):
    """``ran_at``: the stats taken before the epoch's check; returns the bytes sent so far."""
    sent = ran_at["total_bytes_sent"]
    if hvd.rank() == 0:
        ranks = sorted(set(ran_at["levels"].values()))
        print(f"epoch {epoch}: test accuracy {accuracy:.3f}, PowerSGD rank(s) {ranks}, "
              f"{(sent - sent_before) / 1e3:.1f} kB sent", flush=True)
    return sent


def report_end(hvd, accuracy, stats):
    if hvd.rank() == 0:
        print(f"trained on {hvd.size()} ranks with Accordion PowerSGD 2/1: {len(stats['checks'])} checks, "
              f"test accuracy {accuracy:.3f}", flush=True)
        if hvd.size() == 1:
            print("one rank only: launch with `horovodrun -np 2 python -m horovod_accordion.examples.demo`", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=("torch", "tensorflow"), default="torch")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--interval", type=int, default=2,
                        help="windows (here, epochs) between two checks of the gradient norms "
                             "(the paper's 10 suits 300-epoch runs)")
    args = parser.parse_args()
    require_horovod()
    (train_torch if args.framework == "torch" else train_tensorflow)(args)


def require_horovod():
    """Exit with what to do where Horovod is missing: a torch-only environment (the DDP and FSDP
    route) has none, and a bare ``ModuleNotFoundError`` names neither the installer nor that route.
    Horovod's top package only: ``horovod.tensorflow`` would bind Keras before the TF demo asks for
    tf_keras."""
    try:
        importlib.import_module("horovod")
    except ImportError as missing:
        sys.exit(f"this demo trains with Horovod, which this environment cannot import ({missing}).\n"
                 f"Build and install the patched Horovod with `python -m horovod_accordion.tools.install_horovod` "
                 f"(docs/getting-started/install.md), then launch `horovodrun -np 2 python -m "
                 f"horovod_accordion.examples.demo`.\n"
                 f"Without Horovod, torch's DDP and FSDP2 run Accordion as a communication hook: "
                 f"docs/getting-started/ddp.md and docs/getting-started/fsdp.md.")


if __name__ == "__main__":
    main()
