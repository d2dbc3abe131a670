"""Lightning's ``ModelParallelStrategy`` with ``horovod_accordion.fsdp`` on 4 processes (``torchrun``,
Gloo, CPU): the LightningModule shards itself on a replicas × shards mesh of its own in
``configure_model`` and builds the state in ``configure_optimizers``, as docs/getting-started/fsdp.md
shows; ``fit`` equals the same steps without Lightning."""
import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from horovod_accordion.fsdp import AccordionState, PowerSGD
from tests.workers.fsdp_checks import batch, hooked, local_shards, make_model, mesh, sharded, train
from tests.workers.lightning_checks import setup

__all__ = ["setup"]

COMPRESSION = PowerSGD(2, 1, min_compression_rate=0)
STEPS = 8


class Sharded(pl.LightningModule):
    """``make_model`` on ``batch(step)``, as ``fsdp_checks.train``: the loader's item is only the step."""

    def __init__(self):
        super().__init__()
        self.net = make_model()
        self.accordion = None

    def configure_model(self):
        sharded(self.net, mesh()["shard"])  # the units on the shard dimension of our own mesh

    def training_step(self, step, batch_idx):
        x, y = batch(int(step))
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        self.accordion = AccordionState(mesh(), COMPRESSION, model=self, optimizer=optimizer, window_steps=2,
                                        interval=1)
        return optimizer

    def train_dataloader(self):
        return torch.utils.data.DataLoader(list(range(STEPS)), batch_size=None)


def check_fit_under_model_parallel_strategy_equals_the_plain_fsdp_state_bitwise():
    """8 steps: the same parameters, bitwise, and the same levels at every check, as the state
    without Lightning on the same model, data and optimizer."""
    module = Sharded()
    trainer = pl.Trainer(accelerator="cpu", devices=4, max_epochs=1, use_distributed_sampler=False,
                         strategy=ModelParallelStrategy(data_parallel_size=4, tensor_parallel_size=1), logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module)
    model, optimizer, state = hooked(COMPRESSION)
    train(model, optimizer, STEPS)
    for p, q in zip(local_shards(module.net), local_shards(model)):
        assert torch.equal(p, q), float((p - q).abs().max())
    ours = [list(check["levels"].values()) for check in module.accordion.accordion_stats()["checks"]]
    plain = [list(check["levels"].values()) for check in state.accordion_stats()["checks"]]
    assert ours == plain and module.accordion.iter == STEPS, (ours, plain)
    return {"levels at each check": ours}
