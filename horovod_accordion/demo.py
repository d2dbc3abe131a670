"""The smallest Accordion run: an MLP on synthetic data, PowerSGD rank 2 in critical regimes, rank 1 elsewhere.

    horovodrun -np 2 python -m horovod_accordion.demo

It needs only the wheel's torch extra and the patched Horovod
(``python -m horovod_accordion.install_horovod``). ``examples/`` in the repository has the
full-size versions, with every compression and the comparison runs.
"""
import argparse

import torch

import horovod_accordion.torch as hvd

CLASSES, FEATURES, SAMPLES = 10, 32, 4096


def synthetic_shards(rank, size, seed=0):
    """Gaussian clusters around fixed random centres: this rank's training shard and the test set."""
    generator = torch.Generator().manual_seed(seed)
    centres = 1.5 * torch.randn(CLASSES, FEATURES, generator=generator)
    labels = torch.randint(CLASSES, (SAMPLES,), generator=generator)
    inputs = centres[labels] + 2 * torch.randn(SAMPLES, FEATURES, generator=generator)
    train, test = slice(0, SAMPLES * 3 // 4), slice(SAMPLES * 3 // 4, SAMPLES)
    return inputs[train][rank::size], labels[train][rank::size], inputs[test], labels[test]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--interval", type=int, default=2,
                        help="windows (here, epochs) between two checks of the gradient norms "
                             "(the paper's 10 suits 300-epoch runs)")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = synthetic_shards(hvd.rank(), hvd.size())
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02 * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.powersgd(low_rank=2, high_rank=1),
                                         interval=args.interval)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, args.epochs * 3 // 4), gamma=0.1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for epoch in range(args.epochs):
        for batch in torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch)).split(32):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x_train[batch]), y_train[batch]).backward()
            optimizer.step()
        scheduler.step()
        optimizer.end_epoch()  # closes a detection window
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        stats = optimizer.accordion_stats()
        if hvd.rank() == 0:
            ranks = sorted(set(stats["levels"].values()))
            print(f"epoch {epoch}: test accuracy {accuracy:.3f}, PowerSGD rank(s) now {ranks}, "
                  f"{stats['total_bytes_sent'] / 1e3:.1f} kB sent", flush=True)
    if hvd.rank() == 0:
        print(f"trained on {hvd.size()} ranks with Accordion PowerSGD 2/1: {len(stats['checks'])} checks, "
              f"test accuracy {accuracy:.3f}", flush=True)
        if hvd.size() == 1:
            print("one rank only: launch with `horovodrun -np 2 python -m horovod_accordion.demo`", flush=True)


if __name__ == "__main__":
    main()
