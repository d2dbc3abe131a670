"""``AccordionState`` and ``accordion_hook``: Accordion as a torch DDP communication hook.

::

    state = AccordionState(model, compression=PowerSGD(2, 1), optimizer=optimizer)
    model.register_comm_hook(state, accordion_hook)
    for epoch in ...:
        ...                 # forward, backward (the hook runs here), optimizer.step()
        state.end_epoch()   # on every rank; or pass window_steps=N

The hook runs the same reducers, detector and per-bucket phases as the Horovod optimizer
(``horovod_accordion.exchange``): each DDP bucket's first phase (PowerSGD's P, TopK's
values and indices) goes on the wire when DDP hands the bucket over, while backward goes
on; the last bucket runs the remaining phases of all of them, on the autograd thread. It
chains no collective from a future's callback, as torch's ``powerSGD_hook`` does, so over
Gloo no two threads issue collectives at once.
"""

import weakref

import torch

from horovod_accordion.accordion import Accordion, warn_if_no_window_closed
from horovod_accordion.arguments import check_real_floating, check_same_exchange_on_all_ranks
from horovod_accordion.compression import PowerSGD, TopK
from horovod_accordion.ddp.ops import DistributedOps
from horovod_accordion.exchange import BucketedExchange
from horovod_accordion.metrics import CommunicationLog
from horovod_accordion.reducers import DenseReducer, make_reducer
from horovod_accordion.torch_tensors import summary_writer

__all__ = ["AccordionState", "accordion_hook"]


class AccordionState:
    """What ``accordion_hook`` keeps between steps, in the style of torch's ``PowerSGDState``.

    Args:
        model: the model whose gradients the hook averages: the ``DistributedDataParallel``
            module, or the module it wraps. Levels are decided per parameter, as in the
            Horovod optimizer, so the state maps DDP's buckets (rebuilt after the first step)
            to parameters, and keeps its error feedback per parameter, not per bucket.
        process_group: the group DDP communicates over, as given to DDP; ``None``: the
            default group.
        compression: ``PowerSGD(low_rank, high_rank)`` or ``TopK(low_fraction, high_fraction)``
            (``horovod_accordion.ddp`` exports both): Accordion switches between ℓ_low in
            critical regimes and ℓ_high elsewhere; ``low == high`` is static compression.
        optimizer: the optimizer whose first parameter group's ``lr`` the hook reads before
            each step's first bucket, for the learning-rate decay rule. ``None``: call
            ``observe_lr(lr)`` yourself, or the rule never fires.
        eta, interval, window_steps, per_layer, lr_decay_factor, delta_windows, check_norm,
        verify_levels, log_path, tensorboard_dir: as in ``horovod_accordion.torch.DistributedOptimizer``.
            Windows are epochs closed by ``end_epoch()``, or ``window_steps`` steps.
        Buckets are DDP's own: ``bucket_cap_mb`` on ``DistributedDataParallel`` sizes them.
        start_iter: the first ``start_iter`` steps are a plain allreduce of every bucket, as
            ``powerSGD_hook``'s ``start_powerSGD_iter``; the detector counts them and
            accumulates their gradients all the same. 0 by default: Accordion's ℓ_low
            already covers early training.

    State:
        iter: the steps the hook has averaged (one per backward outside ``no_sync()``):
            ``start_iter`` compares with it.
        levels: each parameter's level now (a PowerSGD rank or a TopK fraction), by name.
        The reducer's state: PowerSGD's error-feedback memory and warm-started Q, TopK's
        residuals, per parameter, kept across level switches so no gradient signal is
        lost; and the detector's window, its accumulated gradient Δ and check history.

    ``state_dict()`` / ``load_state_dict()`` checkpoint all of it; the memories, residuals
    and Δ are each rank's own, so save one per rank to resume exactly. The state also
    pickles (``__getstate__``): unpickled, it has no process group (the default group is
    used, as with ``PowerSGDState``) and no model: call ``bind(model, optimizer)``.
    """

    def __init__(self, model, process_group=None, compression=PowerSGD(2, 1), optimizer=None, *, eta=0.5,
                 interval=10, window_steps=None, per_layer=True, lr_decay_factor=2.0, delta_windows=1,
                 check_norm="local", verify_levels=None, log_path=None, tensorboard_dir=None, start_iter=0):
        if not isinstance(compression, (PowerSGD, TopK)):
            raise ValueError(f"compression must be PowerSGD(low_rank, high_rank) or TopK(low_fraction, "
                             f"high_fraction), got {compression!r}; for a plain allreduce, register no hook")
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(f"start_iter must be an integer >= 0, got {start_iter!r}")
        self.process_group = process_group
        self.compression = compression
        self.start_iter = start_iter
        self.iter = 0
        self._schedule_options = dict(eta=eta, interval=interval, window_steps=window_steps, per_layer=per_layer,
                                      lr_decay_factor=lr_decay_factor, delta_windows=delta_windows,
                                      check_norm=check_norm, verify_levels=verify_levels)
        self.log_path, self.tensorboard_dir = log_path, tensorboard_dir
        self._exchange = None
        self._saved = None  # what an unpickled state restores once bound
        self.bind(model, optimizer)

    def bind(self, model, optimizer=None):
        """Attach the state to ``model`` (and ``optimizer``), which the constructor does; after
        unpickling, attach it to the new model before training. A state already bound keeps
        what it has learnt. A collective: every rank checks that the others have the same
        parameters and compression."""
        log = None
        if self._exchange is not None:
            self._saved, log = self.state_dict(), self._exchange.accordion.log
        module = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        names, params = [name for name, _ in named], [p for _, p in named]
        check_real_floating(names, [p.dtype for p in params], [p.is_floating_point() for p in params])
        self._layer_of = {p: layer for layer, p in enumerate(params)}
        self._names = names
        self._optimizer = optimizer
        self._ops = DistributedOps(self.process_group, params[0].device if params else "cpu")
        check_same_exchange_on_all_ranks(self._ops, names, [p.shape for p in params], [p.dtype for p in params],
                                         self.compression)
        reducer, levels = make_reducer(self.compression, [p.shape for p in params], self._ops, None)
        self._plain = DenseReducer(None, None, self._ops)  # the steps before start_iter
        log = log or CommunicationLog.on_rank(self._ops.rank(), self.log_path, self.tensorboard_dir, summary_writer)
        accordion = Accordion(names, levels, log=log, **self._schedule_options)
        self._exchange = BucketedExchange(accordion, reducer, self._ops, params)
        self._waiting = []  # (future, bucket buffer, layers, gradient views) of the step in progress
        if accordion.adaptive and accordion.window_steps is None:
            weakref.finalize(self, warn_if_no_window_closed, accordion, "state.end_epoch()")
        if self._saved is not None:
            self.load_state_dict(self._saved)
            self._saved = None

    @property
    def levels(self):
        return dict(zip(self._names, self._bound().accordion.levels))

    def observe_lr(self, lr):
        """Tell the detector the learning rate of the coming step (if no ``optimizer`` was given)."""
        self._bound().observe_lr(lr)

    def end_epoch(self):
        """Close an epoch-long detection window. Call it once per epoch, on every rank."""
        self._bound().end_epoch()

    def accordion_stats(self):
        """Bytes sent per step, every check's levels, ratios and norms, and the levels now."""
        return dict(self._bound().accordion.log.as_dict(), levels=self.levels)

    def state_dict(self):
        if self._exchange is None:
            return self._saved
        return dict(self._exchange.state_dict(), iter=self.iter)

    def load_state_dict(self, state_dict):
        self._bound()
        if self._waiting:
            raise RuntimeError("load_state_dict() between backward and the end of its communication")
        self._exchange.load_state_dict(state_dict)
        self.iter = state_dict["iter"]

    def __getstate__(self):
        """Everything but the process group, the model and the optimizer, as ``PowerSGDState``."""
        kept = ("compression", "start_iter", "iter", "_schedule_options", "log_path", "tensorboard_dir")
        return dict({k: self.__dict__[k] for k in kept}, _saved=self.state_dict())

    def __setstate__(self, state):
        self.__dict__.update(dict({"tensorboard_dir": None}, **state))  # pickled before it had one
        self.process_group = None
        self._exchange = None

    def _bound(self):
        if self._exchange is None:
            raise RuntimeError("this AccordionState was unpickled and has no model yet: call "
                               "state.bind(model, optimizer) before training")
        return self._exchange

    def _on_bucket(self, bucket):
        self._bound()
        try:
            if self._optimizer is not None:
                self._exchange.observe_lr(self._optimizer.param_groups[0]["lr"])
            layers = [self._layer(p) for p in bucket.parameters()]
            grads = bucket.gradients()
            self._exchange.start(bucket.index(), layers, grads,
                                 reducer=self._plain if self.iter < self.start_iter else None)
            buffer = bucket.buffer()
            future = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
            self._waiting.append((future, buffer, layers, grads))
            if bucket.is_last():
                self._finish_step()
            return future
        except BaseException:
            self._exchange.started, self._waiting = {}, []
            raise

    def _layer(self, param):
        layer = self._layer_of.get(param)
        if layer is None:
            raise RuntimeError(f"DDP reduces a parameter of shape {tuple(param.shape)} that is not among the "
                               f"model's parameters this AccordionState was built with: build the state from "
                               f"the model given to DistributedDataParallel")
        return layer

    def _finish_step(self):
        outputs = self._exchange.finish()
        for future, buffer, layers, grads in self._waiting:
            for layer, grad in zip(layers, grads):
                grad.copy_(outputs[layer])  # views of the bucket's buffer
            future.set_result(buffer)
        self._waiting = []
        self.iter += 1
        self._exchange.end_step()


def accordion_hook(state, bucket):
    """The DDP communication hook: ``model.register_comm_hook(state, accordion_hook)``."""
    return state._on_bucket(bucket)
