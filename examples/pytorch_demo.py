"""Accordion on PyTorch: an MLP on the embedded digits dataset.

    horovodrun -np 2 --gloo python examples/pytorch_demo.py

The only Horovod-facing change from a plain Horovod script is the import line.
PowerSGD runs at rank 2 (ℓ_low) in critical regimes and rank 1 (ℓ_high) elsewhere;
each check prints every layer's level.
"""
import argparse

import numpy as np
import torch

import horovod_accordion.torch as hvd
from horovod_accordion.examples.ddp_loop import train_epoch
from horovod_accordion.examples.runs import announce
from example_data import digits_shards
from progress import epochs_bar, show, write_checks


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--decay-epoch", type=int, default=10, help="the LR drops 10x here")
    parser.add_argument("--interval", type=int, default=2, help="epochs between Accordion checks")
    parser.add_argument("--compression", nargs="+", choices=sorted(COMPRESSIONS), default=["accordion"],
                        help="one or more: each trains from the same start in turn, in this one launch")
    parser.add_argument("--plain-horovod", action="store_true",
                        help="train with horovod.torch.DistributedOptimizer instead, for comparison")
    return parser.parse_args()


COMPRESSIONS = {
    "accordion": hvd.Compression.powersgd(low_rank=2, high_rank=1),
    "none": hvd.Compression.none,
    "rank1": hvd.Compression.powersgd(1),
    "rank2": hvd.Compression.powersgd(2),
    "topk": hvd.Compression.topk(0.1),
    "fp16": hvd.Compression.fp16,
    "accordion-topk": hvd.Compression.topk(0.99, 0.1),
    "quantized": hvd.Compression.quantized(4),
    "accordion-quantized": hvd.Compression.quantized(8, 4),
}


def train(args, compression, report):
    """Train the demo MLP with ``compression``; ``report`` prints the per-epoch lines and checks."""
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = (torch.from_numpy(a) for a in digits_shards(hvd.rank(), hvd.size()))
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    if args.plain_horovod:
        import horovod.torch
        optimizer = horovod.torch.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    else:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression, interval=args.interval)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=args.decay_epoch, gamma=0.1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    checks_printed = 0
    bar = epochs_bar(args.epochs, hvd.rank() if report else -1, desc="demo")
    for epoch in bar:
        losses = train_epoch(model, optimizer, x_train, y_train, args.batch_size, epoch)
        scheduler.step()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        if report:
            bar.write(f"[rank {hvd.rank()}] epoch {epoch:2d}  loss {np.mean(losses):.4f}  "
                      f"test accuracy {accuracy:.3f}")
        if args.plain_horovod:
            continue
        optimizer.end_epoch()
        stats = optimizer.accordion_stats()
        show(bar, np.mean(losses), stats["total_bytes_sent"], stats["levels"])
        if report and hvd.rank() == 0:
            write_checks(bar, stats["checks"][checks_printed:], epoch)
        checks_printed = len(stats["checks"])
    bar.close()
    return accuracy, (None if args.plain_horovod else optimizer.accordion_stats()["total_bytes_sent"])


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    for name in args.compression:
        train_and_compare(args, name)


def train_and_compare(args, name):
    """Train with compression ``name``; for an adaptive one, with its static ℓ_low too."""
    announce(hvd.rank(), name)
    compression = COMPRESSIONS[name]
    accuracy, sent = train(args, compression, report=True)
    if sent is None:
        return
    lines = [f"[rank 0] {name}: test accuracy {accuracy:.3f}, {sent / 1e3:.1f} kB sent per rank"]
    levels = getattr(compression, "levels", (None, None))
    if levels[0] != levels[1]:
        # The comparison Accordion is about: the same run at static ℓ_low, quietly, on every rank.
        static_low = type(compression)(levels[0])
        low_accuracy, low_sent = train(args, static_low, report=False)
        low_name = {hvd.Compression.powersgd: f"rank {levels[0]}", hvd.Compression.topk: f"TopK {levels[0]:g}",
                    hvd.Compression.quantized: f"{levels[0]} bits"}[type(static_low)]
        lines += [f"[rank 0] static ℓ_low ({low_name}): test accuracy {low_accuracy:.3f}, {low_sent / 1e3:.1f} kB "
                  f"sent per rank",
                  f"[rank 0] {name} sent {sent / low_sent:.2f}x the bytes of static ℓ_low, at "
                  f"{100 * (accuracy - low_accuracy):+.1f} points of accuracy"]
    if hvd.rank() == 0:
        print("\n".join(lines), flush=True)

if __name__ == "__main__":
    main()
