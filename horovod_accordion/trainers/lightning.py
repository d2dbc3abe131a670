"""Accordion in Lightning (``lightning`` 2.x): one callback beside the DDP strategy.

::

    from horovod_accordion.ddp import AccordionState, PowerSGD
    from horovod_accordion.lightning import AccordionCallback

    state = AccordionState(compression=PowerSGD(2, 1))
    trainer = lightning.Trainer(strategy="ddp", callbacks=[AccordionCallback(state)], ...)

Lightning registers a ``DDPStrategy(ddp_comm_state=..., ddp_comm_hook=...)`` hook on CUDA
only (``DDPStrategy._register_ddp_hooks``); the callback registers Accordion's hook itself
when the strategy has not, so the same lines work on CPU and on GPU. Passing
``DDPStrategy(ddp_comm_state=state, ddp_comm_hook=accordion_hook)`` as well does no harm.
"""

import warnings

import lightning.pytorch as pl

from horovod_accordion.core.steps import watched_lr
from horovod_accordion.trainers.common import EveryRankState, attach, step_metrics

__all__ = ["AccordionCallback"]


class AccordionCallback(pl.Callback):
    """Runs an ``AccordionState`` inside ``Trainer.fit``.

    - at fit start, registers the state's hook on the DDP model the strategy built (if the
      strategy did not) and binds the state to the LightningModule's parameters, by name;
      a strategy without DDP, or another comm hook, is an error here, not a silent no-op;
      with ``precision="16-mixed"``, hands the state the precision plugin's ``GradScaler``;
    - before each training batch, shows the detector the first optimizer's learning rate;
    - after each, logs this rank's bytes of the step and each compressed layer's level with
      ``pl_module.log`` (``accordion/bytes``, ``accordion/level/<parameter>``);
    - at each training epoch's end, closes the detection window (unless the state closes its
      own, ``window_steps=N``);
    - saves every rank's state in Lightning's checkpoint (key ``"accordion"``), and each rank
      loads its own when ``fit(ckpt_path=...)`` resumes. Every rank must save (Lightning's
      ``ModelCheckpoint`` and ``trainer.save_checkpoint`` do): gathering the states is a collective.

    Args:
        state: the ``horovod_accordion.ddp.AccordionState``, built without a model.
        log_levels: whether to log each compressed layer's level every step, besides the bytes.
    """

    def __init__(self, state, log_levels=True):
        self.state = state
        self._checkpointed = EveryRankState(state)
        self.log_levels = log_levels

    def on_fit_start(self, trainer, pl_module):
        attach(trainer.strategy.model, self.state, named_by=pl_module,
               grad_scaler=getattr(trainer.precision_plugin, "scaler", None))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.state.observe_lr(watched_lr(trainer.optimizers[0]))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.log_dict(step_metrics(self.state, self.log_levels), on_step=True, on_epoch=False)

    def on_train_epoch_end(self, trainer, pl_module):
        if self.state.window_steps is None:
            self.state.end_epoch()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        checkpoint["accordion"] = self._checkpointed.state_dict()

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        if "accordion" not in checkpoint:
            warnings.warn("this checkpoint holds no Accordion state (key 'accordion'): it was saved without "
                          "AccordionCallback, so Accordion starts afresh (levels, detector, error feedback)")
            return
        self._checkpointed.load_state_dict(checkpoint["accordion"])
