"""Accordion for batch size on PyTorch: small batches in critical regimes, m× larger elsewhere.

    horovodrun -np 2 --gloo python examples/pytorch_batch_switch.py --mode accordion

The loop is an ordinary per-micro-batch loop (zero_grad, backward, step); the optimizer
accumulates m micro-batches when Accordion picks the large batch, communicates once and
scales the learning rate linearly. ``--mode small`` and ``--mode large`` are the static
baselines. Prints the test accuracy and the bytes each rank sent.
"""
import argparse
import json

import torch

import horovod_accordion.torch as hvd
from horovod_accordion.examples.ddp_loop import train_epoch
from example_data import digits_shards
from progress import epochs_bar, show


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["small", "large", "accordion"], default="accordion")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--small-batch", type=int, default=16, help="per rank")
    parser.add_argument("--multiplier", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01, help="for the small global batch")
    parser.add_argument("--decay-epochs", type=int, nargs="*", default=[20], help="LR ÷10 at these epochs")
    parser.add_argument("--interval", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON summary line on rank 0")
    return parser.parse_args()


def main():
    args = parse_args()
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = (torch.from_numpy(a) for a in digits_shards(hvd.rank(), hvd.size()))
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    if args.mode == "accordion":
        optimizer = hvd.DistributedOptimizer(
            sgd, named_parameters=model.named_parameters(), interval=args.interval,
            batch_switch=hvd.BatchSwitch(small_batch=args.small_batch, multiplier=args.multiplier))
        micro_batch = args.small_batch
    else:
        optimizer = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
        micro_batch = args.small_batch * (args.multiplier if args.mode == "large" else 1)
        if args.mode == "large":  # the static large batch gets the same linear LR scaling
            for group in optimizer.param_groups:
                group["lr"] *= args.multiplier
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=args.decay_epochs, gamma=0.1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    bar = epochs_bar(args.epochs, hvd.rank(), desc=args.mode)
    for epoch in bar:
        losses = train_epoch(model, optimizer, x_train, y_train, micro_batch, epoch)
        scheduler.step()
        stats = optimizer.accordion_stats()
        show(bar, losses[-1], stats["total_bytes_sent"], {"micro-batches": optimizer.micro_batches_per_step})
        if args.mode == "accordion":
            optimizer.end_epoch()
            check = optimizer.accordion_stats()["checks"][-1]
            if hvd.rank() == 0 and check["event"] == "check" and check["step"] == optimizer._accordion.step:
                print(f"[rank 0] check after epoch {epoch}: global batch {check['global_batch']}, "
                      f"{check['micro_batches_per_step']} micro-batches per communication", flush=True)
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    stats = optimizer.accordion_stats()
    summary = {"mode": args.mode, "test_accuracy": round(accuracy, 4), "communications": stats["steps"],
               "bytes_sent_per_rank": stats["total_bytes_sent"]}
    if hvd.rank() == 0:
        print(json.dumps(summary) if args.json else f"[rank 0] {summary}", flush=True)


if __name__ == "__main__":
    main()
