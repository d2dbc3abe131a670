"""``DistributedOptimizer``: Horovod's drop-in, with Accordion switching the compression level
or, with ``batch_switch``, the batch size.

Like Horovod's, it is a factory that subclasses the user's optimizer class, so
``isinstance`` and ``state_dict`` keep working. Like DDP, it groups the parameters into
buckets of ``bucket_cap_mb`` (see ``horovod_accordion.core.buckets``): a hook on each parameter's
gradient accumulation starts a bucket's first collective (the dense allreduce, PowerSGD's P,
TopK's values and indices) as soon as its last gradient of the step is in, while backward
goes on; ``synchronize()`` (called by ``step()``) starts the buckets that no backward filled
(unused parameters, gradients set by hand) and runs the remaining phases of all of them.

With ``batch_switch``, ``step()`` and ``zero_grad()`` are called after every micro-batch as
usual; the optimizer accumulates ``micro_batches_per_step`` of them (1 or m, Accordion's
choice), averages them, communicates once and applies the step with a scaled LR. A
micro-batch's backward cannot know whether it completes the large batch (``step()`` decides),
so batch switching communicates in ``synchronize()``.
"""

import functools
import uuid
import warnings
import weakref
from contextlib import contextmanager

import torch
import horovod.torch as hvd
from horovod.torch.compression import Compressor

from horovod_accordion.core.schedule import Accordion, warn_at_exit_if_no_window_closed
from horovod_accordion.core.arguments import (check_on_one_device, check_optimizer_arguments, check_real_floating,
                                        check_same_exchange_on_all_ranks, collective_prefix, under_elastic)
from horovod_accordion.core.batch import schedule_arguments
from horovod_accordion.core.buckets import assign_buckets
from horovod_accordion.core.exchange import BucketedExchange
from horovod_accordion.core.metrics import CommunicationLog
from horovod_accordion.core.reducers import make_reducer
from horovod_accordion.core.steps import StepDriver, watched_lr
from horovod_accordion.torch.compression import Compression
from horovod_accordion.torch_common.compression import PlainCompressor
from horovod_accordion.torch_common.loss_scale import LossScale, grad_scaler_property
from horovod_accordion.torch.ops import TorchCollectives
from horovod_accordion.torch_common.tensors import TorchTensorOps, summary_writer

__all__ = ["AccordionOptimizer", "DistributedOptimizer"]


class AccordionOptimizer:
    """A base of every optimizer ``DistributedOptimizer`` returns, for ``isinstance``."""


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, sparse_as_dense, process_set, batch_switch, bucket_cap_mb,
                 grad_scaler, accordion_options):
        super(self.__class__, self).__init__(params)
        self._params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        # Frozen at construction: like Horovod's, the optimizer never averages them; it says so if
        # one gets a gradient (unfrozen mid-run), once.
        self._frozen = [p for group in self.param_groups for p in group["params"] if not p.requires_grad]
        self._warned_frozen = set()
        names = _parameter_names(self.param_groups, named_parameters)
        self._names = [names[p] for p in self._params]
        self._parameter_names = names  # Horovod's attribute, which code in the wild reads
        check_real_floating(self._names, [p.dtype for p in self._params],
                            [p.is_floating_point() for p in self._params])
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._tensors = TorchTensorOps(self._params[0].device if self._params else "cpu")
        self._collectives = TorchCollectives(self._tensors, process_set, gradient_predivide_factor,
                                             name_prefix=collective_prefix(self._names))
        self._reducer, levels = make_reducer(compression, [p.shape for p in self._params], self._tensors,
                                             self._collectives, (Compressor, PlainCompressor))
        schedule = dict(accordion_options, **schedule_arguments(batch_switch, levels, self._reducer,
                                                                backward_passes_per_step, self._collectives))
        check_on_one_device(self._names, [p.device for p in self._params], schedule["levels"])
        log_path, tensorboard_dir = schedule.pop("log_path"), schedule.pop("tensorboard_dir")
        self._accordion = Accordion(self._names, **schedule)
        # After the schedule has checked its arguments: a bad one raises before Horovod is touched.
        self._accordion.log = CommunicationLog.on_rank(0 if self._collectives.is_first_rank() else None, log_path,
                                                       tensorboard_dir, summary_writer)
        self._loss_scale = LossScale(grad_scaler)
        self._exchange = BucketedExchange(self._accordion, self._reducer, self._params, self._loss_scale)
        self._steps = StepDriver(self._exchange, batch_switch, backward_passes_per_step)
        warn_at_exit_if_no_window_closed(self, self._accordion, "optimizer.end_epoch()")
        self._synchronized = False
        self._should_synchronize = True
        self._buckets = [[layer] for layer in reversed(range(len(self._params)))] if self._reducer.fuses_itself \
            else assign_buckets([p.numel() * p.element_size() for p in self._params], bucket_cap_mb)
        self._bucket_of = {layer: b for b, layers in enumerate(self._buckets) for layer in layers}
        self._reset_buckets()
        if process_set.included():
            # The hooks must not keep the optimizer alive: its finalizer warns about unclosed windows.
            this = weakref.ref(self)
            for layer, p in enumerate(self._params):
                p.register_post_accumulate_grad_hook(functools.partial(_on_gradient_accumulated, this, layer))
                if batch_switch is not None:
                    p.register_hook(functools.partial(_on_gradient_arriving, this, layer))
        # Tells this process's own saved state (an elastic commit) from another rank's file.
        self._owner = uuid.uuid4().hex
        self._compression = compression
        if not under_elastic() and process_set.included():
            self.check_same_parameters_on_all_ranks()

    def check_same_parameters_on_all_ranks(self):
        """A collective. Run at construction, or under ``hvd.elastic`` at every state sync:
        there a worker that joins builds its optimizer while the others train, and must
        not enter a collective they do not."""
        check_same_exchange_on_all_ranks(self._collectives, self._names, [p.shape for p in self._params],
                                         [p.dtype for p in self._params], self._compression,
                                         self._accordion.policy)

    grad_scaler = grad_scaler_property()

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        self._steps.backward_passes_per_step = passes  # each step's micro-batches, for the detector's norms

    def _reset_buckets(self):
        self._passes = [0] * len(self._params)  # backward passes seen this step, per layer
        self._ready = [0] * len(self._buckets)  # layers whose gradient is complete, per bucket
        self._exchange.started = {}
        self._sparse_pending = {}  # bucket -> its sparse allreduce (none, fp16), for the step in progress
        self._held_layers = set()  # with batch_switch: the layers whose gradient holds pending micro-batches

    def _hold_micro_batch(self):
        """A micro-batch that does not complete its large batch: its gradients stay in ``p.grad``."""
        self._held_layers = {layer for layer, p in enumerate(self._params) if p.grad is not None}

    def _gradient_arriving(self, layer):
        """Before a micro-batch's gradient adds to ``layer``'s: a gradient held for the large batch
        in progress that is gone was wiped by ``model.zero_grad()`` (or by hand), with the
        micro-batches it summed; ``optimizer.zero_grad()`` keeps them."""
        if layer in self._held_layers and self._steps.pending_micro_batches > 0 and self._params[layer].grad is None:
            lost = self._steps.held_micro_batches
            self._held_layers = set()
            raise RuntimeError(
                f"the gradient of {self._names[layer]!r} was cleared during a large batch of batch_switch, with "
                f"the {lost} micro-batch(es) it held: call optimizer.zero_grad(), which keeps them until the large "
                f"batch is complete, not model.zero_grad()")

    def _gradient_ready(self, layer):
        """A backward pass has accumulated ``layer``'s gradient: start its bucket once every
        layer in it has all ``backward_passes_per_step`` passes. With ``batch_switch`` it only
        marks a new micro-batch, which ``synchronize()`` or ``step()`` will count: whether it
        completes the large batch is known only then."""
        if self._steps.switches_batch:
            self._steps.new_micro_batch()
            self._synchronized = False
            return
        self._passes[layer] += 1
        if self._passes[layer] > self.backward_passes_per_step:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call to step(). "
                "Increase backward_passes_per_step to accumulate gradients locally. (A gradient penalty's "
                "backward() after loss.backward(create_graph=True) is one more pass: backward_passes_per_step=2.)")
        if self._passes[layer] == self.backward_passes_per_step:
            bucket = self._bucket_of[layer]
            self._ready[bucket] += 1
            if self._ready[bucket] == len(self._buckets[bucket]):
                self._start_bucket(bucket)

    def _start_bucket(self, bucket):
        self._observe_lr()  # this step's levels, before its first collective
        layers = self._buckets[bucket]
        if self._reducer.fuses_itself and not self.sparse_as_dense and self._params[layers[0]].grad is not None \
                and self._params[layers[0]].grad.is_sparse:
            # none and fp16 reduce a sparse gradient Horovod's way; its bucket is its one layer.
            if self._steps.switches_batch:
                raise ValueError(f"parameter {self._names[layers[0]]!r} has a sparse gradient, which batch_switch "
                                 f"does not average over micro-batches: pass sparse_as_dense=True")
            self._sparse_pending[bucket] = self._collectives.start_sparse_allreduce(
                self._params[layers[0]].grad, f"sparse.{self._names[layers[0]]}", self.op)
            return
        grads = [self._dense_grad(self._params[layer]) for layer in layers]
        # The mean over a large batch, of the micro-batches whose gradients this rank holds.
        self._exchange.start(bucket, layers, grads, divisor=self._steps.divisor)

    def synchronize(self):
        """Average the gradients over ranks, compressed at each layer's current level. Returns
        whether it did: always, except with ``batch_switch``.

        With ``batch_switch``, it counts this micro-batch (the ``step()`` that may follow does
        not count it again) and communicates only when the micro-batch completes the large
        batch. Before that, it returns ``False``: the gradients stay local and add up, and a
        ``step()`` under ``skip_synchronize()`` is skipped, as ``step()`` alone would be. Unscale
        or clip only when it returns ``True``."""
        if not self.process_set.included():
            self._synchronized = True
            return True
        if self._steps.switches_batch:
            if self._synchronized:
                return True  # this micro-batch's large batch is already averaged: no exchange of nothing
            if not self._count_micro_batch():
                self._hold_micro_batch()
                return False
        for bucket in range(len(self._buckets)):
            if bucket not in self._exchange.started and bucket not in self._sparse_pending:
                self._start_bucket(bucket)
        try:
            averaged = self._exchange.finish()
            for bucket, pending in self._sparse_pending.items():
                # Sparse gradients refuse set_: zero and add, as Horovod's optimizer does.
                self._params[self._buckets[bucket][0]].grad.zero_().add_(pending.wait())
        finally:
            self._reset_buckets()  # after a failed collective too: elastic retries the step
        self._warn_of_frozen_changes()
        for layer, p in enumerate(self._params):
            if layer not in averaged:
                continue  # reduced sparse, by op already
            if p.grad is None and not p.requires_grad:
                continue  # frozen since: its error feedback must not move it
            grad = averaged[layer] * self._collectives.size() if self.op == hvd.Sum else averaged[layer]
            if p.grad is None:
                p.grad = grad.clone()  # the average may be a view of a buffer that the next step reuses
            elif p.grad.is_sparse:
                p.grad = grad.to_sparse()
            else:
                # Outside autograd: a gradient made with backward(create_graph=True) keeps its graph,
                # so a Hessian-vector product through p.grad differentiates this rank's gradient, as
                # it would without Horovod, where a recorded copy would have cut it off.
                with torch.no_grad():
                    p.grad.copy_(grad)
        self._steps.end_steps()
        self._synchronized = True
        return True

    def _warn_of_frozen_changes(self):
        """Once per parameter: one frozen after construction (its memory no longer reaches it), or
        one unfrozen after it (never averaged: the replicas would drift apart)."""
        names = self._parameter_names
        for p in self._params:
            if not p.requires_grad and p not in self._warned_frozen:
                self._warned_frozen.add(p)
                warnings.warn(f"parameter {names.get(p)!r} was frozen after the optimizer was built: it is left out "
                              f"of the update (its error feedback still travels). Rebuild the optimizer to drop it "
                              f"from the exchange", RuntimeWarning)
        for p in self._frozen:
            if p.grad is not None and p not in self._warned_frozen:
                self._warned_frozen.add(p)
                warnings.warn(f"parameter {names.get(p)!r} was frozen when the optimizer was built and has a "
                              f"gradient now: it is not averaged over ranks (as in Horovod), so the replicas drift "
                              f"apart. Rebuild the optimizer after unfreezing it", RuntimeWarning)

    def _observe_lr(self):
        """Before the step's first bucket (in batch mode, the micro-batch's count observes it
        first, so a decay switches to the small batch at once). Once per step: see
        ``BucketedExchange.observe_lr``."""
        self._steps.observe_lr(watched_lr(self))

    def _dense_grad(self, p):
        if p.grad is None:
            # Another rank may have a gradient for it (a dynamic forward); all ranks must
            # contribute the same tensors to the fused collectives.
            return torch.zeros_like(p)
        if p.grad.is_sparse:
            if not self.sparse_as_dense:
                raise ValueError(
                    f"parameter {self._names[self._params.index(p)]!r} has a sparse gradient; Accordion "
                    f"compresses dense tensors only: pass sparse_as_dense=True (Compression.none and fp16 "
                    f"reduce it sparse, as Horovod does)")
            return p.grad.to_dense()
        # A gradient made with backward(create_graph=True) has a history, which the kept state
        # (memory, residual, Δ) must not copy: it would hold every step's graph.
        return p.grad.detach()

    def end_epoch(self):
        """Close an epoch-long detection window. Call it once per epoch, on every rank."""
        self._exchange.end_epoch()

    @property
    def micro_batches_per_step(self):
        """How many micro-batches (``step()`` calls) make one communication now."""
        return self._steps.micro_batches_per_step

    @property
    def levels(self):
        """Each compressed parameter's level now (a PowerSGD rank, a TopK fraction, or with
        ``batch_switch`` every parameter's micro-batches per step), by name. A tensor the
        compression leaves whole (1-D, or too small to gain) has no level and is not listed."""
        return self._accordion.named_levels

    def accordion_stats(self):
        """Bytes sent per step, every check's levels, ratios and norms, and the levels now."""
        return dict(self._accordion.log.as_dict(), levels=self.levels)

    @contextmanager
    def skip_synchronize(self):
        """Use after an explicit ``synchronize()``, e.g. to clip the averaged gradients."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def _count_micro_batch(self):
        """Count this micro-batch once, whichever of ``synchronize()`` and ``step()`` comes
        first; whether it completes the large batch."""
        return self._steps.count_micro_batch(watched_lr(self))

    def step(self, closure=None):
        if self._steps.switches_batch and not self._count_micro_batch():
            self._steps.new_micro_batch()
            self._hold_micro_batch()
            return None  # keep accumulating this large batch
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context "
                              "after optimizer.synchronize(); the gradients are averaged twice")
            self.synchronize()
        self._synchronized = False
        self._steps.new_micro_batch()
        if not self._steps.switches_batch:
            return super(self.__class__, self).step(closure)
        return self._step_with_lr_factor(closure, self._steps.lr_factor)

    def _step_with_lr_factor(self, closure, factor):
        """Scale the LR for this step only: the user's scheduler keeps owning the base LR,
        and the detector keeps seeing it unscaled."""
        base = [group["lr"] for group in self.param_groups]
        for group in self.param_groups:
            group["lr"] = group["lr"] * factor
        try:
            return super(self.__class__, self).step(closure)
        finally:
            for group, lr in zip(self.param_groups, base):
                group["lr"] = lr

    def zero_grad(self, set_to_none=True):
        if self._exchange.started or self._sparse_pending:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(). This is prohibited as it can cause a race condition.")
        self._steps.new_micro_batch()  # even where no step() followed synchronize()
        if self._steps.pending_micro_batches > 0:
            return  # mid-way through a large batch: the micro-batch gradients must add up
        super(self.__class__, self).zero_grad(set_to_none)

    def state_dict(self):
        """The wrapped optimizer's state, plus Accordion's. ``accordion["per_rank"]`` holds what
        is this rank's own (error-feedback memory, TopK residuals, the window's Δ, the
        gradients of a large batch in progress): save one file per rank to resume exactly."""
        state = super(self.__class__, self).state_dict()
        pending = self._steps.pending_micro_batches > 0
        state["accordion"] = self._exchange.state_dict()
        state["accordion"]["micro_batches"] = self._steps.state_dict()
        state["accordion"]["per_rank"].update(
            owner=self._owner,
            gradients=[None if p.grad is None else p.grad.clone() for p in self._params] if pending else None,
            held=self._steps.held_micro_batches)
        return state

    def load_state_dict(self, state_dict):
        """Restore a ``state_dict()``. The per-rank part is restored only in the process that
        saved it (an elastic commit, whatever its rank is now), or on the rank and in the
        world size that saved it; elsewhere it restarts from zero, with a warning (the usual
        "rank 0 saves one file" checkpoint): the shared state still resumes exactly."""
        state_dict = dict(state_dict)
        accordion_state = state_dict.pop("accordion", None)
        if accordion_state is not None:  # checked first: a mismatch leaves this optimizer as it was
            self._exchange.check_compatible(accordion_state, self._owns(accordion_state))
            self._steps.check_compatible(accordion_state["micro_batches"])
        super(self.__class__, self).load_state_dict(state_dict)
        if accordion_state is not None:
            self._load_accordion_state(accordion_state)
        self._synchronized = False
        self._steps.reset()
        self._reset_buckets()  # an elastic restore after a failed step: its collectives are gone
        self._collectives.take_traffic()  # and their traffic is no step's

    def _owns(self, saved):
        """Whether ``saved``'s per-rank part is this process's own: saved by it (an elastic commit,
        whatever its rank is now), or on this rank at this world size."""
        mine = saved["per_rank"]
        here = (self._collectives.rank(), self._collectives.size())
        return mine.get("owner") == self._owner or (mine["rank"], mine["size"]) == here

    def _load_accordion_state(self, saved):
        mine, own = saved["per_rank"], self._owns(saved)
        self._exchange.load_state_dict(saved, own)
        # A rank that takes another's count without its gradients divides by what it holds.
        self._steps.load_state_dict(saved["micro_batches"], held=mine.get("held") if own else 0)
        if own and mine["gradients"] is not None:
            for p, grad in zip(self._params, mine["gradients"]):
                p.grad = None if grad is None else grad.to(p.device)


def _on_gradient_arriving(optimizer_ref, layer, _gradient):
    optimizer = optimizer_ref()
    if optimizer is not None:
        optimizer._gradient_arriving(layer)


def _on_gradient_accumulated(optimizer_ref, layer, _parameter):
    optimizer = optimizer_ref()
    if optimizer is not None:
        optimizer._gradient_ready(layer)


def _parameter_names(param_groups, named_parameters):
    """Names as Horovod gives them, with Horovod's checks."""
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}.{j}"
                for i, group in enumerate(param_groups) for j, p in enumerate(group["params"])}
    named_parameters = list(named_parameters)
    if any(not isinstance(item, tuple) for item in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    names = [name for name, _ in named_parameters]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: "
                         f"{', '.join(duplicates)}")
    by_parameter = {p: name for name, p in named_parameters}
    unnamed = [f"param_groups[{i}]['params'][{j}] of shape {tuple(p.shape)}"
               for i, group in enumerate(param_groups) for j, p in enumerate(group["params"]) if p not in by_parameter]
    if unnamed:
        raise ValueError(f"named_parameters was specified, but {len(unnamed)} model parameters were not named: "
                         f"{', '.join(unnamed[:5])}{', ...' if len(unnamed) > 5 else ''}")
    held = {p for group in param_groups for p in group["params"]}
    foreign = [name for name, p in named_parameters if p not in held and p.requires_grad]
    if foreign:
        # Horovod ignores them; say so, since a parameter left out of the optimizer never trains.
        warnings.warn(f"named_parameters names {len(foreign)} parameter(s) this optimizer does not hold, which "
                      f"it ignores: {', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}", UserWarning)
    return by_parameter


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=hvd.Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=hvd.global_process_set, *,
                         eta=0.5, interval=10, window_steps=None, per_layer=True,
                         lr_decay_factor=2.0, delta_windows=1, check_norm="local", verify_levels=None,
                         log_path=None, tensorboard_dir=None, batch_switch=None, bucket_cap_mb=25,
                         policy="accordion", grad_scaler=None):
    """Wrap ``optimizer`` so that ``step()`` first averages gradients over ranks.

    The first ten arguments are ``horovod.torch.DistributedOptimizer``'s, with its
    defaults. Accordion adapts the level of ``compression=Compression.powersgd(low_rank,
    high_rank)``, ``Compression.topk(low_fraction, high_fraction)`` or
    ``Compression.quantized(low_bits, high_bits)``; with ``Compression.none`` or
    ``Compression.fp16`` it behaves as Horovod's optimizer.

    Args:
        optimizer: the torch optimizer to wrap, as Horovod's.
        named_parameters: as Horovod's; Accordion's logs and checkpoints name the layers after it.
        compression: Horovod's ``Compression.none`` or ``Compression.fp16``, or Accordion's
            ``Compression.powersgd``, ``Compression.topk`` or ``Compression.quantized``.
        backward_passes_per_step: as Horovod's.
        op: ``Average`` or ``Sum``, as Horovod's; ``Adasum`` is refused.
        gradient_predivide_factor: as Horovod's.
        num_groups: as Horovod's (deprecated there).
        groups: as Horovod's.
        sparse_as_dense: as Horovod's.
        process_set: as Horovod's.
        eta: relative change of a layer's accumulated-gradient norm that marks a critical
            regime (ℓ_low). The paper's 0.5.
        interval: check every ``interval`` windows (the paper: 10 epochs).
        window_steps: a window is this many steps; ``None`` (default) means one epoch,
            closed by calling ``optimizer.end_epoch()`` at the end of every epoch.
        per_layer: decide per parameter tensor (the paper) or once for the whole model.
        lr_decay_factor: a learning-rate drop to 1/``lr_decay_factor`` of the highest
            rate since the last such drop puts every layer at ℓ_low until the next
            check. ``None`` disables the rule. See ``horovod_accordion.core.detector``.
        delta_windows: how many windows a check's Δ spans; see ``horovod_accordion.core.schedule.Accordion``.
        check_norm: which norm a check reads; see ``horovod_accordion.core.schedule.Accordion``.
        verify_levels: debugging: whenever the levels are decided, compare those of all ranks and raise
            on every rank if they differ. ``None``: on if ``HOROVOD_ACCORDION_VERIFY_LEVELS=1``.
        log_path: rank 0 appends each step's bytes and each check's levels to this JSONL file.
        tensorboard_dir: rank 0 writes TensorBoard scalars there: bytes per step, and each
            layer's level and ratio at every check (needs the ``tensorboard`` package).
        batch_switch: a ``horovod_accordion.core.batch.BatchSwitch``: switch the batch size
            (1 or m micro-batches per communication, whole-model decision) instead of the
            compression level. Call ``zero_grad()``, ``backward()`` and ``step()`` for every
            micro-batch; the optimizer averages the micro-batches and scales the LR.
        bucket_cap_mb: PowerSGD, TopK and Quantized reduce gradients in buckets of up to this many
            megabytes (the first one: 1 MB), each started from backward as soon as it is
            complete, as in DDP. ``None``: one bucket, started when backward has produced every
            gradient. With ``none`` and ``fp16`` each gradient starts on its own, as in
            Horovod's optimizer, and Horovod's tensor fusion batches them.
        policy: how each layer's level is chosen from the compression's ladder:
            ``"accordion"`` (ℓ_low or ℓ_high), ``"error_budget"``, ``ErrorBudget(slack)`` or
            ``PhaseSchedule(total_windows)``; see ``horovod_accordion.core.policies``.
        grad_scaler: the ``torch.amp.GradScaler`` of an AMP loop, whose loss scale the
            gradients carry: Accordion's Δ and error feedback then work in true units, and the
            averages are handed back scaled, for ``scaler.unscale_``. A GradScaler in use that
            is not passed is named in a warning at the first step (``optimizer.grad_scaler =
            scaler`` also sets it).
    """
    check_optimizer_arguments({hvd.Average: "average", hvd.Sum: "sum", hvd.Adasum: "adasum"}.get(op, op),
                              gradient_predivide_factor, backward_passes_per_step)
    if num_groups != 0:
        warnings.warn("num_groups is deprecated in Horovod; use groups", DeprecationWarning)
        groups = num_groups
    # groups only matter for Horovod's per-parameter allreduces; every phase here is already
    # one fused collective, so they are validated as Horovod does and otherwise unused.
    if groups is not None and not (isinstance(groups, list) or groups > 0):
        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__, AccordionOptimizer),
               dict(_DistributedOptimizer.__dict__))
    accordion_options = dict(eta=eta, interval=interval, window_steps=window_steps, per_layer=per_layer,
                             lr_decay_factor=lr_decay_factor, delta_windows=delta_windows,
                             check_norm=check_norm, verify_levels=verify_levels, log_path=log_path,
                             tensorboard_dir=tensorboard_dir, policy=policy)
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, sparse_as_dense, process_set, batch_switch, bucket_cap_mb,
               grad_scaler, accordion_options)
