"""Accordion in Lightning, on CPU: the demo MLP on the embedded digits dataset.

    torchrun --nproc_per_node 2 examples/lightning_accordion.py --compression accordion

The LightningModule knows nothing of Accordion. Two lines add it: an ``AccordionState``
built without a model, and ``AccordionCallback(state)`` in the trainer's callbacks, which
registers the DDP hook (Lightning registers comm hooks on CUDA only), feeds it the learning
rate, closes a detection window at each epoch's end, logs levels and bytes with ``self.log``
and keeps the state in Lightning's checkpoints. ``--compression none`` and ``fp16`` are the
baselines: each bucket in one allreduce, as DDP's own, with its bytes logged.
"""
import argparse

import lightning.pytorch as pl
import torch

from horovod_accordion.ddp import AccordionState
from horovod_accordion.lightning import AccordionCallback
from ddp_accordion import COMPRESSIONS
from example_data import digits_shards


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--decay-epoch", type=int, default=10, help="the LR drops 10x here")
    parser.add_argument("--interval", type=int, default=2, help="epochs between Accordion checks")
    parser.add_argument("--compression", choices=list(COMPRESSIONS), default="accordion")
    return parser.parse_args()


class DigitsMLP(pl.LightningModule):
    def __init__(self, args):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                                       torch.nn.ReLU(), torch.nn.Linear(64, 10))
        self.args = args

    def setup(self, stage):
        """Each rank's own shard, as the other examples."""
        arrays = digits_shards(self.global_rank, self.trainer.world_size)
        self.x_train, self.y_train, self.x_test, self.y_test = (torch.from_numpy(a) for a in arrays)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(self.x_train, self.y_train)
        return torch.utils.data.DataLoader(data, batch_size=self.args.batch_size, shuffle=True,
                                           generator=torch.Generator().manual_seed(0))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=True, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.args.lr * self.trainer.world_size, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=self.args.decay_epoch, gamma=0.1)]

    def test_accuracy(self):
        with torch.no_grad():
            return (self.net(self.x_test).argmax(1) == self.y_test).float().mean().item()


class ReportChecks(pl.Callback):
    """Prints each epoch's loss and accuracy, and Accordion's new checks, on rank 0 (after
    ``AccordionCallback`` has closed the epoch's window)."""

    def __init__(self, state):
        self.state, self.printed = state, 0

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.global_rank != 0:
            return
        epoch, loss = trainer.current_epoch, float(trainer.callback_metrics["loss"])
        print(f"[rank 0] epoch {epoch:2d}  loss {loss:.4f}  test accuracy {pl_module.test_accuracy():.3f}", flush=True)
        checks = self.state.accordion_stats()["checks"]
        for check in checks[self.printed:]:
            levels = "  ".join(f"{name}={level}" for name, level in check["levels"].items())
            what = f"LR decay to {check['lr']:g}" if check["event"] == "lr_decay" else "check"
            print(f"[rank 0] {what} in epoch {epoch}: levels per layer: {levels}", flush=True)
        self.printed = len(checks)


def main():
    args = parse_args()
    state = AccordionState(compression=COMPRESSIONS[args.compression], interval=args.interval)
    callbacks = [AccordionCallback(state), ReportChecks(state)]
    model = DigitsMLP(args)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs, callbacks=callbacks,
                         use_distributed_sampler=False, logger=False, enable_checkpointing=False,
                         enable_model_summary=False)
    trainer.fit(model)
    if trainer.global_rank == 0:
        sent = state.accordion_stats()["total_bytes_sent"] / 1e3
        print(f"[rank 0] {args.compression}: test accuracy {model.test_accuracy():.3f}, {sent:.1f} kB sent per rank",
              flush=True)


if __name__ == "__main__":
    main()
