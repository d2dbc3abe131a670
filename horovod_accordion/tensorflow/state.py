"""``AccordionState``: every piece of Accordion's TensorFlow state, in one checkpointable object.

Create it once, outside ``tf.function``; call ``reduce(grads)`` inside the traced step
(``DistributedGradientTape`` and the Keras ``DistributedOptimizer`` do), and the eager
bookkeeping (``step_end``, ``end_epoch``, ``observe_lr``) between steps. Levels, error
feedback and Q are ``tf.Variable``s, so a level switch is an assignment and never a
retrace. The detector's Python state is mirrored into a string variable, so one
``tf.train.Checkpoint`` saves and restores all of it.
"""

import json

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd
from horovod.tensorflow.compression import Compressor

from horovod_accordion.core.schedule import Accordion
from horovod_accordion.core.arguments import (check_optimizer_arguments, check_real_floating,
                                        check_same_exchange_on_all_ranks, collective_prefix, under_elastic)
from horovod_accordion.core.batch import schedule_arguments
from horovod_accordion.core.exchange import BucketedExchange
from horovod_accordion.core.metrics import CommunicationLog
from horovod_accordion.core.reducers import make_reducer, split_state
from horovod_accordion.core.steps import StepDriver
from horovod_accordion.tensorflow.compression import check_traceable
from horovod_accordion.tensorflow.ops import TensorFlowCollectives
from horovod_accordion.tensorflow.summary import SummaryScalars
from horovod_accordion.tensorflow.tensors import TensorFlowTensorOps

__all__ = ["AccordionState"]

_OP_NAMES = {hvd.Average: "average", hvd.Sum: "sum", hvd.Adasum: "adasum"}


def _variable_name(variable):
    """Keras 3 names a variable within its layer (``kernel``), and within the model by its ``path``."""
    return getattr(variable, "path", variable.name)


class AccordionState(tf.Module):
    """Accordion for a list of TensorFlow variables.

    Args:
        variables: the trainable variables whose gradients are exchanged, in the same
            order on every rank.
        compression: ``Compression.powersgd(low_rank, high_rank)``, ``Compression.topk(...)``,
            ``Compression.quantized(bits)`` (one level: a traced step keeps the bits it was traced
            with), or a plain ``Compression.none`` / ``Compression.fp16``.
        batch_switch: a ``BatchSwitch``: switch the batch size instead of the compression
            level. Micro-batches are added with ``add_micro_batch`` and reduced together by
            ``reduce_pending`` when ``apply_now`` (set by ``begin_micro_batch``) is true.

    ``op``, ``gradient_predivide_factor``, ``sparse_as_dense`` and ``process_set`` are Horovod's.
    ``backward_passes_per_step`` and ``average_aggregated_gradients`` are as in Horovod's Keras
    optimizer: gradients are summed (or averaged) locally over this many ``apply_gradients``
    calls, with ``add_micro_batch``, and exchanged once, by ``reduce_pending``, when
    ``count_backward_pass`` says the step is complete. ``eta``, ``interval``, ``window_steps``,
    ``per_layer``, ``lr_decay_factor``, ``delta_windows``, ``check_norm``, ``verify_levels``,
    ``log_path``, ``tensorboard_dir`` and ``policy`` are as in ``horovod_accordion.torch.DistributedOptimizer``;
    windows are epochs closed by ``end_epoch()``, or ``window_steps`` calls of ``step_end()``.
    """

    def __init__(self, variables, compression, op=hvd.Average, gradient_predivide_factor=1.0,
                 sparse_as_dense=False, process_set=hvd.global_process_set, eta=0.5, interval=10,
                 window_steps=None, per_layer=True, lr_decay_factor=2.0, delta_windows=1, check_norm="local",
                 verify_levels=None, log_path=None, tensorboard_dir=None, batch_switch=None,
                 backward_passes_per_step=1, average_aggregated_gradients=False, name=None, policy="accordion"):
        super().__init__(name=name)
        check_optimizer_arguments(_OP_NAMES.get(op, op), gradient_predivide_factor, backward_passes_per_step)
        self.backward_passes_per_step = backward_passes_per_step
        variables = list(variables)
        names = [_variable_name(v) for v in variables]
        shapes = [tuple(v.shape) for v in variables]
        dtypes = [tf.as_dtype(v.dtype) for v in variables]
        check_real_floating(names, [d.name for d in dtypes], [d.is_floating for d in dtypes])
        self._op = op
        self._sparse_as_dense = sparse_as_dense
        self._shapes = shapes
        self._collectives = TensorFlowCollectives(TensorFlowTensorOps(), process_set, gradient_predivide_factor,
                                                  collective_prefix(names))
        check_traceable(compression)
        self._reducer, levels = make_reducer(compression, shapes, self._collectives.tensors, self._collectives,
                                             Compressor)
        self.batch_switch = batch_switch
        self._log = CommunicationLog()
        schedule = dict(eta=eta, interval=interval, window_steps=window_steps, per_layer=per_layer,
                        lr_decay_factor=lr_decay_factor, delta_windows=delta_windows, check_norm=check_norm,
                        verify_levels=verify_levels, policy=policy)
        schedule.update(schedule_arguments(batch_switch, levels, self._reducer, backward_passes_per_step,
                                           self._collectives))
        self._schedule = Accordion(names, log=self._log, **schedule)
        self._exchange = BucketedExchange(self._schedule, self._reducer, variables)
        self._steps = StepDriver(self._exchange, batch_switch, backward_passes_per_step)
        self._compression = compression
        self._variables = variables
        if not under_elastic() and process_set.included():
            self.check_same_variables_on_all_ranks()
        if self._collectives.is_first_rank():
            self._log.path = log_path
            self.write_tensorboard(tensorboard_dir)
        # Tracked by tf.train.Checkpoint through tf.Module's attribute tracking.
        self.reducer_variables = {f"{group}_{i}": holder for group, entries in self._reducer.state().items()
                                  for i, holder in entries.items()}
        self.accumulated = self._exchange.accumulated
        self.window_accumulates = self._exchange.accumulating  # derived from the schedule, saved beside it
        self.non_finite_counts = self._exchange.non_finite_counts
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")
        if batch_switch is not None:
            self.micro_batches_driven = False  # whether anything calls begin_micro_batch
            self.apply_now = tf.Variable(False, trainable=False, name="apply_now")
            self.lr_factor = tf.Variable(1.0, trainable=False, name="lr_factor")
        if batch_switch is not None or backward_passes_per_step > 1:
            self.pending = [tf.Variable(tf.zeros(shape, tf.float32), trainable=False, name=f"pending_{k}")
                            for k, shape in enumerate(shapes)]
            # What the pending sum is divided by: the micro-batches of a batch switch, or
            # Horovod's average_aggregated_gradients rule.
            divisor = backward_passes_per_step if average_aggregated_gradients else 1
            self.pending_count = tf.Variable(float(divisor), trainable=False, name="pending_count")
            self.passes = tf.Variable(0, dtype=tf.int64, trainable=False, name="backward_passes")
        self._synced_json = self._dump()
        self.schedule_json = tf.Variable(self._synced_json, dtype=tf.string, trainable=False, name="schedule")
        # The check history grows with the run: a variable of its own, written only when it grows,
        # and told apart by its count, so that no batch reads or writes it whole.
        self._synced_checks = 0
        self.check_history = tf.Variable("[]", dtype=tf.string, trainable=False, name="check_history")
        self.check_count = tf.Variable(0, dtype=tf.int64, trainable=False, name="check_count")

    def check_variables(self, variables):
        """Raise a ``ValueError`` unless ``variables`` are this state's, in its order: its error
        feedback, Q and Δ are per position, so another list would mix one layer's into another's."""
        variables = list(variables)
        position = next((k for k, (a, b) in enumerate(zip(variables, self._variables)) if a is not b),
                        None if len(variables) == len(self._variables) else min(len(variables), len(self._variables)))
        if position is not None:
            given = _variable_name(variables[position]) if position < len(variables) else "nothing"
            expected = _variable_name(self._variables[position]) if position < len(self._variables) else "nothing"
            raise ValueError(
                f"the {len(variables)} variables given are not this AccordionState's {len(self._variables)}, in "
                f"its order: at position {position}, {given} was given where it has {expected}. Pass the same "
                f"variables, in the same order, as the state was created with.")

    def check_same_variables_on_all_ranks(self):
        """A collective: at construction, or under ``hvd.elastic`` at every state sync."""
        check_same_exchange_on_all_ranks(self._collectives, self._schedule.layer_names, self._shapes,
                                         [tf.as_dtype(v.dtype).name for v in self._variables], self._compression,
                                         self._schedule.policy)

    def snapshot(self):
        """Every variable's value, for an in-memory commit (``hvd.elastic``)."""
        return [v.numpy() for v in self.variables]

    def snapshot_names(self):
        """The names of ``snapshot()``'s values, in its order, to save beside them: each variable's
        path in this state (``reducer_variables/memory_0``), which, unlike a variable's name, no
        name scope in force at its creation changes."""
        return ["/".join(map(str, path)) for path, _ in self._flatten(
            predicate=lambda v: isinstance(v, tf.Variable), with_path=True, expand_composites=True)]

    def load_snapshot(self, values, names=None):
        """Assign a ``snapshot()``; ``names``, where saved beside it, are checked too. A snapshot
        of another model or configuration (count, names or shapes) is a ``ValueError``, raised
        before anything is assigned."""
        variables, own_names = self.variables, self.snapshot_names()
        problem = None
        if len(values) != len(variables):
            problem = f"it holds {len(values)} values, this state has {len(variables)} variables"
        elif names is not None and list(names) != own_names:
            problem = next(f"value {k} is {saved!r}, this state's variable {k} is {own!r}"
                           for k, (saved, own) in enumerate(zip(names, own_names)) if saved != own)
        else:
            problem = next((f"value {k} ({v.name}) has shape {np.shape(value)}, the variable {tuple(v.shape)}"
                            for k, (value, v) in enumerate(zip(values, variables))
                            if tuple(np.shape(value)) != tuple(v.shape)), None)
        if problem is not None:
            raise ValueError(f"this Accordion snapshot does not fit this AccordionState: {problem}. It was saved "
                             f"with another model, compression or configuration")
        for variable, value in zip(variables, values):
            variable.assign(value)
        self._reducer.restored()
        self._exchange.abandon_step()  # on every rank, whether its schedule changed or not
        self._collectives.take_traffic()  # an elastic restore: the failed step's traffic is no step's

    def broadcast_shared_state(self, root_rank):
        """Give every rank ``root_rank``'s levels, detector, Q, step and micro-batch counters,
        as after a restore on that rank alone. Each rank keeps its error-feedback memory,
        residuals, Δ and pending gradients, which are its own. Eager; call it on every rank."""
        shared = self._shared_variables()
        root = hvd.rank() == root_rank
        if self.batch_switch is not None:
            with self._python_state():
                held = self._steps.held_micro_batches  # the micro-batches whose gradients this rank's pending sums hold
        values = hvd.broadcast_object({k: v.numpy() for k, v in shared.items()} if root else None,
                                      root_rank=root_rank, process_set=self._collectives.process_set,
                                      name="accordion.shared_state")
        for key, variable in shared.items():
            variable.assign(values[key])
        self._exchange.abandon_step()  # what the root carried, a joining rank did not
        if self.batch_switch is not None:
            with self._python_state():  # the root's count: this rank divides by what it holds of it
                self._steps.micro_batches.hold(held)

    def _shared_variables(self):
        shared = {f"{group}_{i}": holder for group, entries in split_state(self._reducer)[0].items()
                  for i, holder in entries.items()}
        shared.update(steps=self.steps, schedule=self.schedule_json, check_history=self.check_history,
                      check_count=self.check_count)
        for name in ("apply_now", "lr_factor", "pending_count", "passes", "window_accumulates"):
            if getattr(self, name, None) is not None:
                shared[name] = getattr(self, name)
        return shared

    @property
    def adaptive(self):
        """Whether the levels switch (ℓ_low ≠ ℓ_high), so that windows matter."""
        return self._schedule.adaptive

    @property
    def window_steps(self):
        return self._schedule.window_steps

    @property
    def levels(self):
        """Each compressed variable's current level, by name (every variable's with
        ``batch_switch``); a tensor the compression leaves whole is not listed."""
        with self._python_state():
            return self._schedule.named_levels

    @property
    def micro_batches_per_step(self):
        return self._steps.micro_batches_per_step

    def reduce(self, grads, micro_batches=None):
        """Average ``grads`` over ranks at each layer's level. Graph-safe. ``grads`` may be a
        sum over ``micro_batches`` micro-batches, which is averaged first."""
        grads = [self._dense(g, shape) for g, shape in zip(grads, self._shapes)]
        # The pending sums are fp32, as is the count the exchange divides them by.
        divisor = None if micro_batches is None else tf.cast(micro_batches, tf.float32)
        if not self._collectives.included():
            # As Horovod: a process outside the set keeps its own gradients, averaged over its micro-batches.
            return grads if divisor is None else [g / divisor for g in grads]
        self.steps.assign_add(1)
        layers = range(len(grads))
        self._exchange.start(0, layers, grads, divisor=divisor)
        averaged = self._exchange.finish()
        averaged = [averaged[layer] for layer in layers]
        if self._op == hvd.Sum:
            averaged = [g * tf.cast(self._collectives.size(), g.dtype) for g in averaged]
        return averaged

    def _dense(self, grad, shape):
        if grad is None:
            # Another rank may have a gradient for it; every rank must fill the same buffers.
            return tf.zeros(shape, tf.float32)
        if isinstance(grad, tf.IndexedSlices):
            if not self._sparse_as_dense:
                raise ValueError("a gradient is sparse (tf.IndexedSlices); Accordion compresses dense "
                                 "tensors only: pass sparse_as_dense=True")
            return tf.convert_to_tensor(grad)
        return grad

    def add_micro_batch(self, grads):
        """Add one micro-batch's gradients to the pending large batch. Graph-safe."""
        for total, grad, shape in zip(self.pending, grads, self._shapes):
            total.assign_add(tf.cast(self._dense(grad, shape), tf.float32))

    def count_backward_pass(self):
        """Count one ``apply_gradients`` call; whether it completes the step. Graph-safe."""
        self.passes.assign_add(1)
        complete = self.passes >= self.backward_passes_per_step
        self.passes.assign(tf.where(complete, tf.zeros_like(self.passes), self.passes))
        return complete

    def reduce_pending(self):
        """Average the pending large batch over its micro-batches and ranks; empty it. Graph-safe."""
        sums = [tf.convert_to_tensor(total) for total in self.pending]
        averaged = self.reduce(sums, micro_batches=self.pending_count)
        for total in self.pending:
            total.assign(tf.zeros_like(total))
        return averaged

    # Eager bookkeeping between steps.
    def begin_micro_batch(self, lr):
        """Before each micro-batch: observe the LR, and decide whether this micro-batch
        completes a step (``apply_now``), with how many micro-batches and which LR factor."""
        self.micro_batches_driven = True
        with self._python_state():  # the count of a large batch in progress is checkpointed
            self._steps.new_micro_batch()
            complete = self._steps.count_micro_batch(float(lr))
        self.apply_now.assign(complete)
        if complete:
            self.pending_count.assign(float(self._steps.divisor or 1))
            self.lr_factor.assign(self._steps.lr_factor)

    def end_micro_batch(self):
        """After each micro-batch: record the step it completed, if any."""
        if self._steps.completed is not None:
            self.step_end()

    def observe_lr(self, lr):
        """Report the learning rate in force; a decay event puts every layer at ℓ_low. It rides on
        the next step's collectives and is agreed over ranks (``BucketedExchange.observe_lr``):
        call it on every rank, before each step."""
        with self._python_state():
            self._steps.observe_lr(float(lr))

    def step_end(self):
        """Record the traffic of the steps run since the last call; close step windows. With a
        batch switch, the last of them is the large batch that ``begin_micro_batch`` completed."""
        with self._python_state():
            self._steps.end_steps(int(self.steps.numpy()) - self._schedule.step)

    def end_epoch(self):
        """Close an epoch-long detection window; call it once per epoch, on every rank."""
        self._exchange.check_epoch_windows()
        self.step_end()
        with self._python_state():
            self._exchange.end_epoch()

    def write_tensorboard(self, logdir):
        """Rank 0 writes Accordion's scalars (bytes per step, levels and ratios per check) to ``logdir``."""
        if logdir is not None and self._collectives.is_first_rank():
            self._log.scalars = SummaryScalars(logdir)

    def accordion_stats(self):
        """Bytes sent per step, every check's levels, ratios and norms, and the levels now: the
        same method as the torch optimizer's and the DDP state's."""
        with self._python_state():  # a restored checkpoint brings its check history
            stats = self._log.as_dict()
        stats["levels"] = self.levels
        return stats

    stats = accordion_stats  # its first name, kept for the code that uses it

    def _python_state(self):
        return _MirroredPythonState(self)

    def _dump(self):
        schedule = self._schedule.state_dict()
        del schedule["checks"]  # in check_history
        return json.dumps({"schedule": schedule,
                           "micro_batches": self._steps.state_dict()})

    def _load(self, text):
        saved = json.loads(text)
        schedule = saved["schedule"]
        if len(schedule["layer_names"]) != len(self._schedule.layer_names):
            raise ValueError(f"the checkpoint's Accordion state has {len(schedule['layer_names'])} variables, this "
                             f"model has {len(self._schedule.layer_names)}")
        # Keras names variables by creation order (dense_3/kernel:0), while the checkpoint
        # matched them by the object graph: keep this process's names.
        schedule["layer_names"] = self._schedule.layer_names
        self._steps.check_compatible(saved["micro_batches"])  # before anything is loaded
        self._exchange.load_schedule(schedule)
        self._steps.load_state_dict(saved["micro_batches"])


class _MirroredPythonState:
    """Loads the schedule and the micro-batch count from their variable if a checkpoint
    restore changed it, and writes it back when an eager update changed it."""

    def __init__(self, state):
        self.state = state

    def __enter__(self):
        state = self.state
        saved = state.schedule_json.numpy().decode()
        if saved != state._synced_json:
            try:
                state._load(saved)
            except ValueError:
                state.schedule_json.assign(state._synced_json)  # refused once: the state stays as it was
                raise
            state._synced_json = saved
        checks = int(state.check_count.numpy())
        if checks != state._synced_checks:
            state._log.checks = json.loads(state.check_history.numpy().decode())
            state._synced_checks = checks

    def __exit__(self, *exc_info):
        state = self.state
        current = state._dump()
        if current != state._synced_json:
            state.schedule_json.assign(current)
            state._synced_json = current
        if len(state._log.checks) != state._synced_checks:
            state.check_history.assign(json.dumps(state._log.checks))
            state.check_count.assign(len(state._log.checks))
            state._synced_checks = len(state._log.checks)
