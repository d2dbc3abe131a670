"""The examples' progress (rank 0 only, with loss, MB sent and the levels now) and check reports.

A tqdm bar where stderr is a terminal; under ``horovodrun`` or ``torchrun``, which pipe it and
prefix each chunk with the rank, a bar's carriage-return updates arrive garbled, so there it is
one plain line per epoch on stdout instead.
"""
import sys

from tqdm import tqdm


class EpochLines:
    """The part of tqdm's interface the examples use, printing one line per finished epoch."""

    def __init__(self, epochs, desc, enabled):
        self.epochs, self.desc, self.enabled = epochs, desc, enabled
        self.postfix = {}
        self.done = 0

    def __iter__(self):
        for epoch in range(self.epochs):
            yield epoch
            self.update()

    def update(self, n=1):
        """An epoch is over: print its line, with the fields ``set_postfix`` gave it."""
        self.done += n
        if self.enabled:
            fields = "  ".join(f"{key} {value}" for key, value in self.postfix.items())
            print(f"{self.desc}: epoch {self.done}/{self.epochs}  {fields}".rstrip(), flush=True)

    def set_postfix(self, ordered_dict=None, **fields):
        self.postfix = {**(ordered_dict or {}), **fields}

    @staticmethod
    def write(line):
        print(line, flush=True)

    def close(self):
        pass


def epochs_bar(epochs, rank, desc="train", enabled=True):
    """Iterate over the epochs with progress shown on rank 0 (none at all if not ``enabled``)."""
    if sys.stderr.isatty():
        return tqdm(range(epochs), desc=desc, unit="epoch", disable=rank != 0 or not enabled)
    return EpochLines(epochs, desc, enabled and rank == 0)


def show(bar, loss, bytes_sent=None, levels=None):
    """``levels``: {layer: level}, the compressed layers' (none with ``none`` and ``fp16``)."""
    postfix = {"loss": f"{loss:.4f}"}
    if bytes_sent is not None:
        postfix["MB"] = f"{bytes_sent / 1e6:.3f}"
    if levels:
        postfix["levels"] = ",".join(f"{level:g}" for level in levels.values())
    bar.set_postfix(postfix)


def write_checks(bar, checks, epoch):
    """Print rank 0's Accordion checks and LR decays of this epoch (``checks``: the new ones)."""
    for check in checks:
        levels = "  ".join(f"{name}={level}" for name, level in check["levels"].items())
        what = (f"LR decay to {check['lr']:g} in epoch {epoch}" if check["event"] == "lr_decay"
                else f"check after epoch {epoch}")
        bar.write(f"[rank 0] {what}: levels per layer: {levels}")


def train_with_epoch_windows(state, model, optimizer, scheduler, data, args, rank, desc):
    """The torch.distributed examples' loop (DDP, FSDP): each epoch trains, steps the scheduler,
    tests, closes ``state``'s window and reports; returns the last test accuracy."""
    import numpy as np
    import torch

    from horovod_accordion.examples.ddp_loop import train_epoch

    x_train, y_train, x_test, y_test = data
    checks_printed = 0
    bar = epochs_bar(args.epochs, rank, desc=desc)
    for epoch in bar:
        losses = train_epoch(model, optimizer, x_train, y_train, args.batch_size, epoch)
        scheduler.step()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        bar.write(f"[rank {rank}] epoch {epoch:2d}  loss {np.mean(losses):.4f}  test accuracy {accuracy:.3f}")
        state.end_epoch()
        stats = state.accordion_stats()
        show(bar, np.mean(losses), stats["total_bytes_sent"], stats["levels"])
        if rank == 0:
            write_checks(bar, stats["checks"][checks_printed:], epoch)
        checks_printed = len(stats["checks"])
    bar.close()
    return accuracy
