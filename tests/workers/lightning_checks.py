"""Lightning with ``AccordionCallback`` on 2 real processes (``torchrun``, Gloo, CPU), against
the plain DDP hook on the same steps and data. ``ACCORDION_SHARED_DIR`` (set by the test)
keeps the uninterrupted run's results and its mid-run checkpoint for the resume launch
(``tests/workers/lightning_resume_checks.py``)."""
import gc
import os
import pathlib
import warnings

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins import MixedPrecision
from lightning.pytorch.strategies import DDPStrategy

from horovod_accordion.ddp import AccordionState, PowerSGD, accordion_hook
from horovod_accordion.lightning import AccordionCallback
from tests.workers.ddp_checks import (assert_same_parameters_on_all_ranks, hooked_with_epoch_windows, levels_history,
                                     loss_at)
from tests.workers.models import SCALE_PER_WINDOW, fixed_or_varying_scaler, make_model

COMPRESSION = PowerSGD(2, 1, min_compression_rate=0)
EPOCHS, STEPS_PER_EPOCH, DECAY_EPOCH, CHECKPOINT_EPOCH = 7, 2, 5, 3  # the LR is a quarter from step 10
SHARED = pathlib.Path(os.environ.get("ACCORDION_SHARED_DIR", "."))


def setup():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")  # the steps are made in training_step
    return dist.get_rank()


class Steps(pl.LightningModule):
    """``make_model``, trained on ``loss_at(step)``, as the DDP checks: the batch is only the step's turn."""

    def __init__(self):
        super().__init__()
        self.net = make_model(seed=0)

    def training_step(self, batch, batch_idx):
        return loss_at(self.net, self.global_step)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=DECAY_EPOCH, gamma=0.25)]

    def train_dataloader(self):
        return torch.utils.data.DataLoader(list(range(STEPS_PER_EPOCH)), batch_size=None)


def trainer(state, epochs=EPOCHS, callbacks=(), **options):
    """On CPU, ``DDPStrategy`` skips the comm hook it is given; the callback registers it."""
    return pl.Trainer(accelerator="cpu", devices=2, max_epochs=epochs, use_distributed_sampler=False,
                      strategy=DDPStrategy(ddp_comm_state=state, ddp_comm_hook=accordion_hook),
                      callbacks=[AccordionCallback(state), *callbacks], logger=False, enable_progress_bar=False,
                      enable_model_summary=False, **dict(dict(enable_checkpointing=bool(callbacks)), **options))


class KeepsTheDDPModel(pl.Callback):
    """Lightning unwraps the model at teardown: this keeps the DDP module that trained."""

    def on_train_end(self, trainer, pl_module):
        self.model = trainer.strategy.model


def check_fit_equals_the_plain_ddp_hook_bitwise_and_saves_a_mid_run_checkpoint():
    """7 epochs of 2 steps, inputs ×10 from step 6, the LR a quarter from epoch 5: on CPU
    the callback registers the hook, levels switch both ways and agree on the ranks
    (``verify_levels``), and the parameters equal the plain DDP hook's bitwise. The run
    saves a checkpoint after epoch 3, which the resume launch starts from."""
    state = AccordionState(compression=COMPRESSION, interval=1)
    assert not state.bound
    module = Steps()
    saver = ModelCheckpoint(dirpath=SHARED, filename="mid-run", every_n_epochs=CHECKPOINT_EPOCH, save_top_k=-1)
    kept = KeepsTheDDPModel()
    fitted = trainer(state, callbacks=[saver, kept])
    fitted.fit(module)

    assert [s for _, s in kept.model._comm_hooks] == [state], "the callback registered the hook once"
    plain, plain_state = hooked_with_epoch_windows(COMPRESSION, EPOCHS, STEPS_PER_EPOCH,
                                                   DECAY_EPOCH * STEPS_PER_EPOCH)
    for (name, p), q in zip(module.net.named_parameters(), plain.parameters()):
        assert torch.equal(p, q), f"{name}: max diff {(p - q).abs().max():.3e}"
    assert_same_parameters_on_all_ranks(module.net)
    history = levels_history(state.accordion_stats())
    assert [(e, step, list(levels.values())) for e, step, levels in history] == \
        [(e, step, list(levels.values())) for e, step, levels in levels_history(plain_state.accordion_stats())]
    # The compressed matrices only: the biases have no level (issue 18: they were listed).
    assert list(history[0][2]) == [f"net.{name}" for name, p in plain.named_parameters() if p.dim() == 2]
    assert [e for e, _, _ in history].count("lr_decay") == 1, history
    seen = [set(levels.values()) for _, _, levels in history]
    assert {2} in seen and {1} in seen and {1, 2} <= set().union(*seen), history
    assert state.iter == EPOCHS * STEPS_PER_EPOCH
    logged = fitted.callback_metrics
    assert float(logged["accordion/bytes"]) == state.bytes_sent_last_step > 0
    assert float(logged["accordion/wire_bytes"]) == state.wire_bytes_sent_last_step > 0
    assert {float(logged[f"accordion/level/net.{name}"]) for name in ("0.weight", "4.weight")} <= {1.0, 2.0}
    assert not [name for name in logged if name.endswith(".bias")], list(logged)
    if dist.get_rank() == 0:
        torch.save({"net": module.net.state_dict(), "history": history}, SHARED / "uninterrupted.pt")
    dist.barrier()
    assert sorted(p.name for p in SHARED.glob("mid-run*.ckpt")) == ["mid-run.ckpt"]
    return {"steps": state.iter, "checks": len(history), "bytes_rank": state.accordion_stats()["total_bytes_sent"]}


def check_the_strategys_hook_alone_on_cpu_is_said_not_silent():
    """Without the callback, Lightning on CPU skips ``DDPStrategy(ddp_comm_hook=...)``: the
    state's hook never runs, and the state says so when it goes."""
    state = AccordionState(compression=COMPRESSION, interval=1)
    fitted = pl.Trainer(accelerator="cpu", devices=2, max_epochs=1, use_distributed_sampler=False,
                        strategy=DDPStrategy(ddp_comm_state=state, ddp_comm_hook=accordion_hook), logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    fitted.fit(Steps())
    assert not state.bound
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del fitted, state
        gc.collect()
    said = [str(w.message) for w in caught if "hook never ran" in str(w.message)]
    assert len(said) == 1 and "AccordionCallback" in said[0], [str(w.message) for w in caught]
    return said[0]


class LossScaledFP32(MixedPrecision):
    """Lightning's ``16-mixed`` plugin, its GradScaler and all, with fp32 maths: on a CPU, where
    Lightning turns ``precision="16-mixed"`` into bf16, this is how a scaler reaches a run, and
    fp32 makes a run at another loss scale exactly comparable (``train_under_loss_scale``)."""

    def __init__(self, scaler):
        super().__init__("16-mixed", "cpu", scaler=scaler)

    def forward_context(self):
        return torch.autocast("cpu", enabled=False)


class MovesTheScale(pl.Callback):
    """After every epoch's last step, sets the loss scale to the next of ``SCALE_PER_WINDOW``."""

    def __init__(self, scaler):
        self.scaler = scaler

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch + 1 < len(SCALE_PER_WINDOW):
            self.scaler.update(new_scale=SCALE_PER_WINDOW[trainer.current_epoch + 1])


def check_16_mixed_hands_its_grad_scaler_to_the_state_and_levels_ignore_the_scale():
    """The precision plugin's GradScaler reaches the state through ``AccordionCallback``, with no
    argument: a run whose scale moves every epoch (window) decides the levels of a run at a fixed
    scale, and ends at the same parameters."""
    runs = []
    for varying in (False, True):
        scaler = fixed_or_varying_scaler(varying)
        state = AccordionState(compression=COMPRESSION, interval=1)
        module = Steps()
        trainer(state, epochs=len(SCALE_PER_WINDOW), callbacks=[MovesTheScale(scaler)] if varying else [],
                plugins=[LossScaledFP32(scaler)], enable_checkpointing=False).fit(module)
        assert state.grad_scaler is scaler
        runs.append((levels_history(state.accordion_stats()), [p.detach().clone() for p in module.net.parameters()]))
    (fixed_history, fixed_weights), (history, weights) = runs
    assert history == fixed_history, (fixed_history, history)
    assert all(torch.equal(a, b) for a, b in zip(weights, fixed_weights))
