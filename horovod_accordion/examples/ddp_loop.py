"""What the torch examples share: the DDP examples' compressions, arguments, model, data and
report, and every torch example's epoch, so that each example shows only its trainer's part."""
import argparse

import torch

from horovod_accordion.ddp import Compression, PowerSGD, Quantized, TopK
from horovod_accordion.examples.data import CLASSES, FEATURES, synthetic_shards
from horovod_accordion.examples.runs import announce, say

COMPRESSIONS = {
    "accordion": PowerSGD(low_rank=2, high_rank=1),
    "rank1": PowerSGD(1),
    "rank2": PowerSGD(2),
    "topk": TopK(0.1),
    "accordion-topk": TopK(0.99, 0.1),
    "quantized": Quantized(4),
    "accordion-quantized": Quantized(8, 4),
    "none": Compression.none,  # the baselines: each bucket in one allreduce, as DDP's own, with its bytes logged
    "fp16": Compression.fp16,
}


def argument_parser(description):
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--decay-epoch", type=int, default=10, help="the LR drops 10x here")
    parser.add_argument("--interval", type=int, default=2, help="epochs between Accordion checks")
    parser.add_argument("--compression", nargs="+", choices=list(COMPRESSIONS), default=["accordion"],
                        help="one or more: each trains from the same start in turn, in this one launch")
    return parser


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))


def shards(rank, size):
    """This rank's training shard and the whole test set, as tensors."""
    return tuple(torch.from_numpy(a) for a in synthetic_shards(rank, size))


def sgd_with_step_decay(parameters, args, size):
    optimizer = torch.optim.SGD(parameters, lr=args.lr * size, momentum=0.9)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=args.decay_epoch, gamma=0.1)


def train_epoch(model, optimizer, x_train, y_train, batch_size, epoch, backward=torch.Tensor.backward):
    """Shuffled mini-batches (the same order on every rank); returns their losses."""
    order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
    losses = []
    for batch in order.split(batch_size):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x_train[batch]), y_train[batch])
        backward(loss)
        optimizer.step()
        losses.append(loss.item())
    return losses


def accuracy(model, x_test, y_test):
    with torch.no_grad():
        return (model(x_test).argmax(1) == y_test).float().mean().item()


class Report:
    """Each rank's epoch line; on rank 0, Accordion's new checks and LR decays, and the last line."""

    def __init__(self, state, rank, compression):
        self.state, self.rank, self.compression = state, rank, compression
        self.checks_printed = 0
        announce(rank, compression)

    def epoch(self, epoch, losses, test_accuracy):
        """After the epoch's window closed; ``losses``: the epoch's, or its mean alone."""
        loss = sum(losses) / len(losses)
        say(f"[rank {self.rank}] epoch {epoch:2d}  loss {loss:.4f}  test accuracy {test_accuracy:.3f}")
        checks = self.state.accordion_stats()["checks"]
        if self.rank == 0:
            for check in checks[self.checks_printed:]:
                levels = "  ".join(f"{name}={level}" for name, level in check["levels"].items())
                what = (f"LR decay to {check['lr']:g} in epoch {epoch}" if check["event"] == "lr_decay"
                        else f"check after epoch {epoch}")
                say(f"[rank 0] {what}: levels per layer: {levels}")
        self.checks_printed = len(checks)

    def end(self, test_accuracy):
        if self.rank == 0:
            sent = self.state.accordion_stats()["total_bytes_sent"] / 1e3
            say(f"[rank 0] {self.compression}: test accuracy {test_accuracy:.3f}, {sent:.1f} kB sent per rank")
