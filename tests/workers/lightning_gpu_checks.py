"""Lightning on one GPU (``make test-gpu``), under ``torchrun`` with one rank: there
``DDPStrategy(ddp_comm_state=state, ddp_comm_hook=accordion_hook)`` registers the hook itself
(on CPU it does not, see ``lightning_checks.py``), and ``AccordionCallback`` must leave that
registration alone and run the state as on CPU. ``ACCORDION_TEST_DEVICE=cpu`` runs the check
on the CPU, where the callback registers the hook, to test the check where there is no GPU."""
import os

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy

from horovod_accordion.ddp import AccordionState, accordion_hook
from horovod_accordion.lightning import AccordionCallback
from tests.workers.ddp_checks import levels_history
from tests.workers.lightning_checks import COMPRESSION, DECAY_EPOCH, EPOCHS, STEPS_PER_EPOCH, KeepsTheDDPModel, Steps
from tests.workers.models import batch_of_rank

DEVICE = os.environ.get("ACCORDION_TEST_DEVICE", "cuda")


def setup():
    torch.set_num_threads(1)
    return int(os.environ.get("RANK", 0))  # Lightning starts the process group


class StepsOnTheDevice(Steps):
    def training_step(self, batch, batch_idx):
        x, y = batch_of_rank(self.global_rank, self.global_step, scale=10.0 if self.global_step >= 6 else 1.0)
        return torch.nn.functional.cross_entropy(self.net(x.to(self.device)), y.to(self.device))


class DevicesAtTrainEnd(pl.Callback):
    """Lightning moves the model back to the CPU at teardown: this notes where it trained."""

    def on_train_end(self, trainer, pl_module):
        self.types = {p.device.type for p in pl_module.parameters()}


def check_the_strategy_registers_the_hook_on_the_gpu_and_the_callback_runs_the_state():
    state = AccordionState(compression=COMPRESSION, interval=1)
    kept, devices = KeepsTheDDPModel(), DevicesAtTrainEnd()
    module = StepsOnTheDevice()
    fitted = pl.Trainer(accelerator="gpu" if DEVICE == "cuda" else "cpu", devices=1, max_epochs=EPOCHS, use_distributed_sampler=False,
                        strategy=DDPStrategy(ddp_comm_state=state, ddp_comm_hook=accordion_hook),
                        callbacks=[AccordionCallback(state), kept, devices], logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    fitted.fit(module)
    assert [s for _, s in kept.model._comm_hooks] == [state], "registered once (by the strategy on the GPU)"
    assert state.iter == EPOCHS * STEPS_PER_EPOCH
    assert all(sent > 0 for sent in state.accordion_stats()["bytes_per_step"])
    assert devices.types == {DEVICE}, devices.types
    assert all(torch.isfinite(p).all() for p in module.net.parameters())
    history = levels_history(state.accordion_stats())
    assert [e for e, _, _ in history].count("lr_decay") == 1, history  # StepLR at DECAY_EPOCH
    assert history[-1][1] == EPOCHS * STEPS_PER_EPOCH and DECAY_EPOCH < EPOCHS, history
    return {"steps": state.iter, "checks": len(history), "bytes": state.accordion_stats()["total_bytes_sent"]}
