"""Accordion in Ray Train, on a local Ray cluster of 2 CPUs: the demo MLP on the embedded digits dataset.

    python examples/ray_train_accordion.py --compression accordion

``TorchTrainer`` runs ``train_loop_per_worker`` on 2 workers (Gloo). In the loop,
``ray.train.torch.prepare_model`` wraps the model in DDP and ``prepare_accordion`` puts
Accordion's hook on it; the hook reads the learning rate from the optimizer, the loop
closes a detection window at each epoch's end, and ``report`` adds Accordion's bytes and
levels to ``ray.train.report``. ``--compression none`` and ``fp16`` are the baselines,
through the same hook with their bytes logged.
``--address auto`` joins a running cluster instead of starting one.
"""
import argparse
import os

import ray
import ray.train
import ray.train.torch
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    from ddp_accordion import COMPRESSIONS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--decay-epoch", type=int, default=10, help="the LR drops 10x here")
    parser.add_argument("--interval", type=int, default=2, help="epochs between Accordion checks")
    parser.add_argument("--compression", choices=list(COMPRESSIONS), default="accordion")
    parser.add_argument("--address", help="a running Ray cluster; by default, a local one of 2 CPUs")
    return parser.parse_args()


def train_loop_per_worker(args):
    """On each worker; the examples' modules come by PYTHONPATH (see ``main``)."""
    import numpy as np
    import torch

    from horovod_accordion.ddp import AccordionState
    from horovod_accordion.ray_train import prepare_accordion, report
    from ddp_accordion import COMPRESSIONS
    from example_data import digits_shards
    from progress import epochs_bar, show, write_checks
    from torch_epoch import train_epoch

    context = ray.train.get_context()
    rank, size = context.get_world_rank(), context.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = (torch.from_numpy(a) for a in digits_shards(rank, size))
    model = ray.train.torch.prepare_model(torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args["lr"] * size, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=args["decay_epoch"], gamma=0.1)
    state = prepare_accordion(model, AccordionState(compression=COMPRESSIONS[args["compression"]],
                                                    interval=args["interval"]), optimizer)

    checks_printed = 0
    bar = epochs_bar(args["epochs"], rank, desc="ray")
    for epoch in bar:
        losses = train_epoch(model, optimizer, x_train, y_train, args["batch_size"], epoch)
        scheduler.step()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        bar.write(f"[rank {rank}] epoch {epoch:2d}  loss {np.mean(losses):.4f}  test accuracy {accuracy:.3f}")
        state.end_epoch()
        report(state, {"epoch": epoch, "loss": float(np.mean(losses)), "accuracy": accuracy})
        stats = state.accordion_stats()
        show(bar, np.mean(losses), stats["total_bytes_sent"], stats["levels"])
        if rank == 0:
            write_checks(bar, stats["checks"][checks_printed:], epoch)
        checks_printed = len(stats["checks"])
    bar.close()
    if rank == 0:
        sent = state.accordion_stats()["total_bytes_sent"] / 1e3
        print(f"[rank 0] {args['compression']}: test accuracy {accuracy:.3f}, {sent:.1f} kB sent per rank", flush=True)


def main():
    args = parse_args()
    # The workers import the examples' modules (data, progress bar) from here.
    path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    ray.init(address=args.address, num_cpus=None if args.address else 2, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    TorchTrainer(train_loop_per_worker, train_loop_config=vars(args),
                 scaling_config=ScalingConfig(num_workers=2, use_gpu=False)).fit()


if __name__ == "__main__":
    main()
