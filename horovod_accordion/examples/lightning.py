"""Accordion in Lightning, on CPU: the demo's MLP on the demo's synthetic clusters.

    torchrun --nproc_per_node 2 -m horovod_accordion.examples.lightning --compression accordion

The LightningModule knows nothing of Accordion. Two lines add it: an ``AccordionState``
built without a model, and ``AccordionCallback(state)`` in the trainer's callbacks, which
registers the DDP hook (Lightning registers comm hooks on CUDA only), feeds it the learning
rate, closes a detection window at each epoch's end, logs levels and bytes with ``self.log``
and keeps the state in Lightning's checkpoints. ``--compression none`` and ``fp16`` are the
baselines: each bucket in one allreduce, as DDP's own, with its bytes logged.
"""
import lightning.pytorch as pl
import torch

from horovod_accordion.ddp import AccordionState
from horovod_accordion.examples.ddp_loop import COMPRESSIONS, Report, accuracy, argument_parser, mlp, \
    sgd_with_step_decay, shards
from horovod_accordion.lightning import AccordionCallback


class ClustersMLP(pl.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.net = mlp()
        self.args = args

    def setup(self, stage):
        """Each rank's own shard, as the other examples."""
        self.x_train, self.y_train, self.x_test, self.y_test = shards(self.global_rank, self.trainer.world_size)

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
        optimizer, scheduler = sgd_with_step_decay(self.parameters(), self.args, self.trainer.world_size)
        return [optimizer], [scheduler]

    def test_accuracy(self):
        return accuracy(self.net, self.x_test, self.y_test)


class ReportEpochs(pl.Callback):
    """The examples' report, after ``AccordionCallback`` has closed the epoch's window."""

    def __init__(self, state, compression):
        self.state, self.compression = state, compression

    def setup(self, trainer, pl_module, stage):
        self.report = Report(self.state, trainer.global_rank, self.compression)

    def on_train_epoch_end(self, trainer, pl_module):
        self.report.epoch(trainer.current_epoch, [float(trainer.callback_metrics["loss"])], pl_module.test_accuracy())

    def on_fit_end(self, trainer, pl_module):
        self.report.end(pl_module.test_accuracy())


def main():
    args = argument_parser(__doc__).parse_args()
    for compression in args.compression:
        state = AccordionState(compression=COMPRESSIONS[compression], interval=args.interval)
        trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
                             callbacks=[AccordionCallback(state), ReportEpochs(state, compression)],
                             use_distributed_sampler=False, logger=False, enable_checkpointing=False,
                             enable_model_summary=False, enable_progress_bar=False)
        trainer.fit(ClustersMLP(args))


if __name__ == "__main__":
    main()
