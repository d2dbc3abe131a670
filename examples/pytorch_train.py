"""Train a model with Accordion, or a static baseline, and log every epoch: the study's program.

    horovodrun -np 4 --gloo python examples/pytorch_train.py --dataset mnist1d --model cnn1d \
        --compression powersgd --levels 4 1 --record run.jsonl

``--compression`` picks the family (none, fp16, powersgd, topk); ``--levels LOW HIGH`` its
ℓ_low and ℓ_high (equal levels are the static baseline), or a ladder ``LOW MIDDLE... HIGH``
for ``--policy error_budget`` or ``phase`` to choose from; ``--batch-switch M`` switches
between the per-rank batch and M times it instead. The schedule is the study's: a linear
warm-up, then the learning rate ×0.1 at 50 % and 75 % of the epochs.

Rank 0 shows a progress bar (loss, MB sent, levels) and, with ``--record``, writes one JSON
line per epoch (test accuracy, loss, bytes sent per rank, wall time, LR, each layer's
level), the Accordion checks and LR decays as they happen, and a final ``done`` line.
"""
import argparse
import time

import torch

import horovod_accordion.torch as hvd
from example_data import DATASETS, load, shard
from progress import epochs_bar
from study_run import RunRecord, add_compression_arguments, compression_of, policy_of, show_epoch


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=DATASETS, default="mnist1d")
    parser.add_argument("--data-dir", help="where cifar10 lies (cifar-10-batches-py); nothing is downloaded")
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn1d")
    add_compression_arguments(parser, levels=(4, 1))
    parser.add_argument("--batch-switch", type=int, metavar="M",
                        help="switch between --batch-size and M times it (fixed --compression)")
    parser.add_argument("--large-batch", action="store_true",
                        help="the static large-batch baseline: M=--batch-switch times the batch, always")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.1, help="after the warm-up, for the global --batch-size")
    parser.add_argument("--warmup-epochs", type=int, default=3)
    parser.add_argument("--warmup-lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--interval", type=int, default=2, help="epochs between Accordion checks")
    parser.add_argument("--whole-model", action="store_true", help="one decision for the model, not per layer")
    parser.add_argument("--delta-windows", type=int, default=1, help="epochs accumulated into a check's Δ")
    parser.add_argument("--check-norm", choices=["local", "averaged"], default="local")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", help="rank 0 writes the per-epoch JSONL record here")
    parser.add_argument("--tensorboard-dir", help="rank 0 writes Accordion's scalars here")
    parser.add_argument("--no-progress", action="store_true", help="no per-epoch progress; the result line stays")
    return parser.parse_args(argv)


def cnn1d(channels):
    """MNIST-1D's 1-D CNN: three strided Conv1d layers with ReLU, then a linear classifier."""
    return torch.nn.Sequential(
        torch.nn.Conv1d(1, channels, 5, stride=2), torch.nn.ReLU(),
        torch.nn.Conv1d(channels, channels, 3, stride=2), torch.nn.ReLU(),
        torch.nn.Conv1d(channels, channels, 3, stride=2), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(channels * 3, 10))


def cnn2d():
    """A small CIFAR-10 CNN: two conv blocks and a classifier."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 8 * 8, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 10))


MODELS = {"cnn1d": lambda: cnn1d(32), "cnn1d-wide": lambda: cnn1d(64), "cnn2d": cnn2d, "mlp": mlp}


def lr_factor(args, epoch):
    """Linear warm-up from --warmup-lr, then ×0.1 at 50 % and ×0.01 at 75 % of the epochs."""
    if epoch < args.warmup_epochs:
        return (args.warmup_lr + (args.lr - args.warmup_lr) * epoch / args.warmup_epochs) / args.lr
    return 0.1 ** sum(epoch >= args.epochs * milestone for milestone in (0.5, 0.75))


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = (torch.from_numpy(a) for a in
                                        shard(load(args.dataset, args.data_dir), hvd.rank(), hvd.size()))
    model = MODELS[args.model]()
    multiplier = args.batch_switch if args.large_batch else 1  # the static large batch scales its LR linearly
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr * multiplier, momentum=args.momentum,
                          weight_decay=args.weight_decay)
    batch_switch = None
    if args.batch_switch and not args.large_batch:
        batch_switch = hvd.BatchSwitch(small_batch=args.batch_size, multiplier=args.batch_switch)
    optimizer = hvd.DistributedOptimizer(
        sgd, named_parameters=model.named_parameters(), compression=compression_of(args),
        interval=args.interval, per_layer=not args.whole_model, delta_windows=args.delta_windows,
        check_norm=args.check_norm, batch_switch=batch_switch, tensorboard_dir=args.tensorboard_dir,
        policy=policy_of(args, total_windows=args.epochs))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: lr_factor(args, epoch))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    log = RunRecord(args.record, hvd.rank())
    log.write({"event": "config", "workers": hvd.size(), **vars(args)})
    micro_batch = args.batch_size * multiplier
    bar = epochs_bar(args.epochs, hvd.rank(), enabled=not args.no_progress)
    seconds = 0.0
    for epoch in bar:
        started = time.perf_counter()
        lr = optimizer.param_groups[0]["lr"]
        global_batch = micro_batch * hvd.size() * optimizer.micro_batches_per_step
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(1000 * args.seed + epoch))
        loss_sum = torch.zeros(2)
        model.train()
        for start in range(0, len(order), micro_batch):
            batch = order[start:start + micro_batch]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            loss_sum += torch.tensor([loss.item() * len(batch), len(batch)])
        levels = optimizer.accordion_stats()["levels"]  # in force this epoch; the check below sets the next
        scheduler.step()
        optimizer.end_epoch()
        seconds += time.perf_counter() - started
        loss_sum = hvd.allreduce(loss_sum, op=hvd.Sum, name="train.loss")
        model.eval()
        with torch.no_grad():
            accuracy = 100.0 * (model(x_test).argmax(1) == y_test).float().mean().item()
        stats = optimizer.accordion_stats()
        log.write_new_checks(stats, epoch)
        record = {"event": "epoch", "epoch": epoch, "test_accuracy": round(accuracy, 2),
                  "loss": round(float(loss_sum[0] / loss_sum[1]), 5),
                  "bytes_sent_per_rank": stats["total_bytes_sent"],
                  "wire_bytes_sent_per_rank": stats["total_wire_bytes_sent"], "wall_time_s": round(seconds, 3),
                  "lr": lr, "levels": levels, "global_batch": global_batch}
        log.write(record)
        show_epoch(bar, record, acc=record["test_accuracy"])
    log.finish(record, ("test_accuracy", "bytes_sent_per_rank", "wire_bytes_sent_per_rank", "wall_time_s"),
               args.compression,
               f"test accuracy {record['test_accuracy']:.2f} %")
    return record


if __name__ == "__main__":
    main(parse_args())
