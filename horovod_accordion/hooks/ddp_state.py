"""``AccordionState`` and ``accordion_hook``: Accordion as a torch DDP communication hook.

::

    state = AccordionState(compression=PowerSGD(2, 1))   # before or after DDP wraps the model
    model.register_comm_hook(state, accordion_hook)
    for epoch in ...:
        ...                 # state.observe_lr(lr), forward, backward (the hook runs here), optimizer.step()
        state.end_epoch()   # on every rank; or pass window_steps=N

As torch's ``PowerSGDState(process_group, ...)``, the state needs no model: a trainer can
build it before it wraps the model (Lightning's ``DDPStrategy(ddp_comm_state=...)``). It binds
itself at the first hook call, to the parameters DDP hands over.

The hook runs the same reducers, detector and per-bucket phases as the Horovod optimizer
(``horovod_accordion.core.exchange``): each DDP bucket's first phase (PowerSGD's P, TopK's
values and indices) goes on the wire when DDP hands the bucket over, while backward goes
on; the last bucket runs the remaining phases of all of them, on the autograd thread. It
chains no collective from a future's callback, as torch's ``powerSGD_hook`` does, so over
Gloo no two threads issue collectives at once.
"""

import sys
import warnings
import weakref

import torch

from horovod_accordion.core.schedule import warn_at_exit_if_no_window_closed
from horovod_accordion.core.arguments import check_on_one_device
from horovod_accordion.core.compression import PowerSGD
from horovod_accordion.hooks.ops import DistributedCollectives
from horovod_accordion.hooks.exchange import HookStateViews, build_exchange, hook_loss_scale, schedule_options
from horovod_accordion.core.reducers import DenseReducer
from horovod_accordion.torch_common.compression import check_hook_compression, compression_levels
from horovod_accordion.torch_common.loss_scale import grad_scaler_property
from horovod_accordion.torch_common.tensors import TorchTensorOps

__all__ = ["AccordionState", "accordion_hook"]


class AccordionState(HookStateViews):
    """What ``accordion_hook`` keeps between steps, in the style of torch's ``PowerSGDState``.

    Args:
        process_group: the group DDP communicates over, as given to DDP; ``None``: the
            default group.
        compression: ``PowerSGD(low_rank, high_rank)``, ``TopK(low_fraction, high_fraction)`` or
            ``Quantized(low_bits, high_bits)`` (``Compression.powersgd``, ``.topk``, ``.quantized``),
            or ``Compression.none`` / ``fp16``: Accordion switches between ℓ_low
            in critical regimes and ℓ_high elsewhere; ``low == high`` is static compression.
            ``Compression.none`` and ``Compression.fp16`` average each bucket in one allreduce,
            in the gradients' precision or in fp16 (divided before the sum, as torch's
            ``fp16_compress_hook``): baselines whose bytes are logged as Accordion's are.
        model: optional, the model whose gradients the hook averages (the
            ``DistributedDataParallel`` module, or the module it wraps): its parameter names
            name the layers in logs and checkpoints, and the cross-rank check runs here rather
            than at the first step. Without it, the state binds itself at the first hook call
            (see ``bind``). Levels are decided per parameter, as in the Horovod optimizer, so
            the state maps DDP's buckets (rebuilt after the first step) to parameters, and
            keeps its error feedback per parameter, not per bucket.
        optimizer: the optimizer whose first parameter group's ``lr`` the hook reads before
            each step's first bucket, for the learning-rate decay rule. ``None``: call
            ``observe_lr(lr)`` yourself, or the rule never fires.
        start_iter: the first ``start_iter`` steps are a plain allreduce of every bucket, as
            ``powerSGD_hook``'s ``start_powerSGD_iter``; the detector counts them and
            accumulates their gradients all the same. 0 by default: Accordion's ℓ_low
            already covers early training.
        grad_scaler: the ``torch.amp.GradScaler`` of an AMP loop, whose loss scale the
            gradients carry: Δ and the error feedback then work in true units, and the averages
            are handed back scaled, for ``scaler.unscale_``. Lightning's ``AccordionCallback``
            and Accelerate's ``register_accordion`` take the trainer's own. A GradScaler in use
            that is not passed is named in a warning at the first step (``state.grad_scaler =
            scaler`` also sets it).

        bf16_wire: bf16 gradients that travel uncompressed (``none``, and the 1-D tensors of
            PowerSGD and TopK) go on the wire as bf16, half the bytes, where by default they go as
            fp32: a sum over ranks then keeps fp32's bits, and the bytes are those of the Horovod
            optimizer, whose Horovod 0.28.1 rejects a bf16 allreduce. PowerSGD's P and Q are fp32
            either way.

    The other keyword arguments, ``eta``, ``interval``, ``window_steps``, ``per_layer``,
    ``lr_decay_factor``, ``delta_windows``, ``check_norm``, ``verify_levels``, ``log_path``,
    ``tensorboard_dir`` and ``policy``, are as in ``horovod_accordion.torch.DistributedOptimizer``. Windows
    are epochs closed by ``end_epoch()``, or ``window_steps`` steps. Buckets are DDP's own:
    ``bucket_cap_mb`` on ``DistributedDataParallel`` sizes them.

    State:
        iter: the steps the hook has averaged (one per backward outside ``no_sync()``):
            ``start_iter`` compares with it.
        levels: each compressed parameter's level now (a PowerSGD rank or a TopK fraction), by
            name; a tensor left whole (1-D, or too small to gain) has none.
        The reducer's state: PowerSGD's error-feedback memory and warm-started Q, TopK's
        residuals, per parameter, kept across level switches so no gradient signal is
        lost; and the detector's window, its accumulated gradient Δ and check history.

    ``state_dict()`` / ``load_state_dict()`` checkpoint all of it; the memories, residuals
    and Δ are each rank's own, so save one per rank to resume exactly. A state dict loaded
    before the state is bound applies when it binds. The state also pickles
    (``__getstate__``): unpickled, it has no process group (the default group is used, as
    with ``PowerSGDState``), no model and no optimizer, and binds itself again at its first
    hook call (or ``bind(model, optimizer)``).
    """

    def __init__(self, process_group=None, compression=PowerSGD(2, 1), *, model=None, optimizer=None, eta=0.5,
                 interval=10, window_steps=None, per_layer=True, lr_decay_factor=2.0, delta_windows=1,
                 check_norm="local", verify_levels=None, log_path=None, tensorboard_dir=None, start_iter=0,
                 policy="accordion", grad_scaler=None, bf16_wire=False):
        if isinstance(process_group, torch.nn.Module):
            raise TypeError("AccordionState's first argument is the process group, as PowerSGDState's, and the "
                            "model is optional: write AccordionState(compression=..., optimizer=...), or "
                            "AccordionState(compression=..., model=model, optimizer=...) for the model's "
                            "parameter names in logs")
        check_hook_compression(compression)
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(f"start_iter must be an integer >= 0, got {start_iter!r}")
        self.process_group = process_group
        self.compression = compression
        self.start_iter = start_iter
        self.iter = 0
        self._schedule_options = schedule_options(
            compression, policy, eta=eta, interval=interval, window_steps=window_steps, per_layer=per_layer,
            lr_decay_factor=lr_decay_factor, delta_windows=delta_windows, check_norm=check_norm,
            verify_levels=verify_levels)
        self.log_path, self.tensorboard_dir = log_path, tensorboard_dir
        self.bf16_wire = bf16_wire
        self._loss_scale = hook_loss_scale(grad_scaler)
        self._unbound()
        self._optimizer = optimizer
        self._hook_watch = HookWatch()
        weakref.finalize(self, _warn_if_hook_never_ran, self._hook_watch)
        if model is not None:
            self.bind(model, optimizer)

    def _unbound(self):
        """The fields of a state not bound to parameters yet (new, or unpickled)."""
        self._exchange = self._steps = None
        self._saved = getattr(self, "_saved", None)  # a state dict to restore once bound
        self._lr_before_binding = getattr(self, "_lr_before_binding", None)
        self._optimizer = None
        self._arrived = []  # the buckets of the step in progress, while unbound
        self._waiting = []  # (future, bucket buffer, layers, gradient views) of the step in progress

    def bind(self, model, optimizer=None):
        """Attach the state to ``model`` (and ``optimizer``, if given; else it keeps the one it
        has): its parameter names name the layers, and the cross-rank check runs now. Without
        ``bind``, the first hook call binds the state to the parameters of DDP's buckets, named
        ``parameters[i]`` in the order of ``model.parameters()`` (DDP's first buckets hold them
        in reverse order; with several dtypes or devices, in DDP's own order, the same on every
        rank), or named as in the state dict loaded before. A state already bound keeps what it
        has learnt. A collective: every rank checks that the others have the same parameters and
        compression."""
        module = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        self._optimizer = optimizer if optimizer is not None else self._optimizer
        self._bind_parameters([name for name, _ in named], [p for _, p in named])

    def _bind_parameters(self, names, params):
        """Bind to ``params``, keeping what a bound state has learnt. A failure (a check, another
        rank's parameters, a checkpoint that does not fit) leaves the state exactly as it was:
        bound to its parameters, or unbound with its pending checkpoint. Half-bound, the next hook
        call would re-bind by position, and same-shaped layers could swap memories."""
        before = {field: self.__dict__.get(field) for field in _BINDING}
        saved = self.state_dict()
        log = self._exchange.accordion.log if self.bound else None
        try:
            check_on_one_device(names, [p.device for p in params], self._levels())
            self._layer_of = {p: layer for layer, p in enumerate(params)}
            self._names = names
            tensors = TorchTensorOps(params[0].device if params else "cpu", self.bf16_wire)
            self._collectives = DistributedCollectives(tensors, self.process_group)
            self._plain = DenseReducer(None, None, tensors, self._collectives)  # the steps before start_iter
            # DDP's no_sync() accumulates micro-batches: no batch switch
            self._exchange, self._steps = build_exchange(
                names, params, self.compression, self._schedule_options, self._collectives,
                loss_scale=self._loss_scale, log=log, log_path=self.log_path, tensorboard_dir=self.tensorboard_dir)
            accordion = self._exchange.accordion
            self._waiting = []
            if saved is not None:
                self.load_state_dict(saved)
        except BaseException:
            self.__dict__.update(before)
            raise
        self._saved = None
        warn_at_exit_if_no_window_closed(self, accordion, "state.end_epoch()")
        if self._lr_before_binding is not None:
            self._steps.observe_lr(self._lr_before_binding)
            self._lr_before_binding = None

    def _bind_to_first_buckets(self):
        """Bind to the parameters of the first step's buckets, which DDP hands over in index
        order and built from ``model.parameters()`` reversed: read back from the last bucket
        to the first, they are in the model's order, the same on every rank."""
        params = [p for bucket in sorted(self._arrived, key=lambda b: -b.index) for p in bucket.params]
        names = [f"parameters[{i}]" for i in range(len(params))]
        saved_names = (self._saved or {}).get("schedule", {}).get("layer_names")
        if saved_names and saved_names != names:
            # Named by a model: DDP's bucket order need not be the model's (several dtypes), so
            # matching the names by position could give one layer another's memory.
            raise ValueError(f"the checkpoint loaded into this state names its layers after a model "
                             f"({saved_names[0]!r}, ...): pass model= to AccordionState, or call bind(model), "
                             f"before the first step")
        self._bind_parameters(names, params)

    @property
    def bound(self):
        """Whether the state has its parameters (a ``model`` given, ``bind`` or a first step)."""
        return self._exchange is not None

    grad_scaler = grad_scaler_property()

    @property
    def window_steps(self):
        """``None``: windows are epochs, closed by ``end_epoch()``; else their length in steps."""
        return self._schedule_options["window_steps"]

    def state_dict(self):
        """Before the state is bound: the state dict loaded into it, if any, else ``None``."""
        if not self.bound:
            return self._saved
        return dict(self._exchange.state_dict(), iter=self.iter)

    def load_state_dict(self, state_dict):
        """Restore a ``state_dict()``; before the state is bound, it is restored when it binds."""
        if not self.bound:
            # What can be checked without the parameters is checked now, where the mistake is made.
            saved_levels = tuple((state_dict or {}).get("schedule", {}).get("levels", self._levels()))
            if saved_levels != self._levels():
                raise ValueError(f"checkpoint levels {saved_levels} differ from this state's {self._levels()}")
            self._saved = state_dict
            return
        if self._waiting:
            raise RuntimeError("load_state_dict() between backward and the end of its communication")
        self._exchange.load_state_dict(state_dict)
        self.iter = state_dict["iter"]

    def __getstate__(self):
        """Everything but the process group, the model, the optimizer and the GradScaler, as ``PowerSGDState``."""
        kept = ("compression", "start_iter", "iter", "_schedule_options", "log_path", "tensorboard_dir",
                "_lr_before_binding", "_loss_scale", "bf16_wire")
        return dict({k: self.__dict__[k] for k in kept}, _saved=self.state_dict())

    def __setstate__(self, state):
        # A state pickled before it had these.
        self.__dict__.update(dict({"tensorboard_dir": None, "_loss_scale": hook_loss_scale(), "bf16_wire": False}, **state))
        self.process_group = None
        self._unbound()
        self._hook_watch = HookWatch(ran=True)  # an unpickled state may be read only: no warning for it

    def _levels(self):
        return compression_levels(self.compression)

    def _bound(self):
        if not self.bound:
            raise RuntimeError("this AccordionState has no parameters yet: it binds itself at the first step's "
                               "communication hook call (or pass model=, or call state.bind(model)), and "
                               + ("no step has gone through it yet" if self._hook_watch.registered
                                  else f"its hook has not run: {HookWatch.HOW_TO_REGISTER}"))
        return self._exchange

    def _on_bucket(self, bucket):
        self._hook_watch.ran = True
        buffer = bucket.buffer()
        arrived = _Bucket(bucket.index(), bucket.parameters(), bucket.gradients(), buffer,
                          torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None))
        try:
            if self.bound:
                self._start(arrived)
            else:
                # Nothing can start before every parameter is known: the first step waits for its last bucket.
                if any(earlier.index == arrived.index for earlier in self._arrived):
                    raise RuntimeError(f"DDP bucket {arrived.index} came twice in one step: this AccordionState "
                                       f"is registered on two models; build one state per DDP model")
                self._arrived.append(arrived)
                if bucket.is_last():
                    self._bind_to_first_buckets()
                    for earlier in self._arrived:
                        self._start(earlier)
                    self._arrived = []
            if bucket.is_last():
                self._finish_step()
            return arrived.future
        except BaseException:
            if self._exchange is not None:
                self._exchange.abandon_step()
            self._arrived, self._waiting = [], []
            raise

    def _start(self, bucket):
        self._observe_optimizer_lr()
        layers = [self._layer(p) for p in bucket.params]
        self._exchange.start(bucket.index, layers, bucket.grads,
                             reducer=self._plain if self.iter < self.start_iter else None)
        self._waiting.append((bucket.future, bucket.buffer, layers, bucket.grads))

    def _layer(self, param):
        layer = self._layer_of.get(param)
        if layer is None:
            raise RuntimeError(f"DDP reduces a parameter of shape {tuple(param.shape)} that is not among the "
                               f"{len(self._names)} parameters this AccordionState is bound to: one state serves "
                               f"one DDP model (build one per model, or bind(model) to move it to another)")
        return layer

    def _finish_step(self):
        outputs = self._exchange.finish()
        for future, buffer, layers, grads in self._waiting:
            for layer, grad in zip(layers, grads):
                grad.copy_(outputs[layer])  # views of the bucket's buffer
            future.set_result(buffer)
        self._waiting = []
        self.iter += 1
        self._steps.end_steps()


# What binding sets: restored whole when a bind fails.
_BINDING = ("_layer_of", "_names", "_collectives", "_plain", "_exchange", "_steps", "_waiting", "_saved")


class HookWatch:
    """What the state's finalizer reads, without keeping the state alive: whether its hook ran,
    and whether a trainer integration registered it."""

    HOW_TO_REGISTER = ("register it on the DDP model (model.register_comm_hook(state, accordion_hook)); in a "
                       "trainer, horovod_accordion.lightning.AccordionCallback(state) (Lightning registers "
                       "DDPStrategy(ddp_comm_hook=...) on CUDA only), horovod_accordion.accelerate."
                       "register_accordion or horovod_accordion.ray_train.prepare_accordion")

    def __init__(self, ran=False):
        self.ran, self.registered = ran, False


def _warn_if_hook_never_ran(watch):
    """When the state goes (or at exit): a state built for training whose hook never ran. Not
    after an uncaught exception: the traceback above says why no step ran."""
    if watch.ran or getattr(sys, "last_value", None) is not None:
        return
    if watch.registered:
        warnings.warn("an AccordionState's hook was registered on the DDP model, but no training step went through "
                      "it, so Accordion averaged nothing", RuntimeWarning)
    else:
        warnings.warn(f"an AccordionState's hook never ran, so Accordion averaged nothing: {HookWatch.HOW_TO_REGISTER}",
                      RuntimeWarning)


class _Bucket:
    """What the hook keeps of a ``GradBucket``: gradients are views of ``buffer``."""

    def __init__(self, index, params, grads, buffer, future):
        self.index, self.params, self.grads, self.buffer, self.future = index, params, grads, buffer, future


def accordion_hook(state, bucket):
    """The DDP communication hook: ``model.register_comm_hook(state, accordion_hook)``."""
    return state._on_bucket(bucket)
