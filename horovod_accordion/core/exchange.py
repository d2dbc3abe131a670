"""One optimizer step's gradient exchange, bucket by bucket: the only per-step protocol,
for every backend. Horovod's torch optimizer starts a bucket from its gradient hooks, torch
DDP from its communication hook, TensorFlow with the whole model as one bucket in the
traced step.

Each bucket is started as soon as its gradients are in: the detector's Δ and non-finite
counts take their share, and the reducer's first phase goes on the wire while backward
goes on. ``finish`` runs the remaining phases of every started bucket, and ``end_step``
counts the step and closes a window when one is complete: at a check, the exchange reduces
the norms of Δ over ranks and hands them to the schedule (``Accordion``), which decides.
The adapters only say when a bucket is ready and where the averages go.

Under a loss scale S (``torch.amp.GradScaler``) the gradients arrive as S × the true ones:
the exchange divides them by S before Δ and the reducer see them, and multiplies the averages
by S, so that the levels and the error feedback are in true units and the scaler's own
``unscale_`` still finds the scale it expects.

Under hybrid sharding (FSDP2, ``sharding``) each rank holds one shard of every layer, and the
reducer averages it over the shard's replicas only. What the detector reads is then reduced
over the whole world: a layer's squared norm (and approximation error) is the sum of its
shards', and the agreed rate and the levels' check span every rank, so that every shard of a
layer runs at the same level.
"""

import warnings
from typing import Optional

from horovod_accordion.core.backends import CollectiveOps, EagerTensorOps, Sharding
from horovod_accordion.core.rates import CARRYING_BUCKET, RateAgreement
from horovod_accordion.core.reducers import BucketReduction, split_state

__all__ = ["END_EPOCH_BEFORE_ANY_STEP", "BucketedExchange", "check_epoch_windows", "warn_end_epoch_before_any_step"]


END_EPOCH_BEFORE_ANY_STEP = (
    "end_epoch() was called before any training step: there is no detection window to close, so it did "
    "nothing. Call it at the end of each epoch, after the epoch's optimizer steps")


def check_epoch_windows(window_steps):
    """Refuse ``end_epoch()`` where windows are ``window_steps`` long."""
    if window_steps is not None:
        raise RuntimeError(f"window_steps={window_steps} closes a window every {window_steps} steps by itself; "
                           f"end_epoch() is for window_steps=None")


def warn_end_epoch_before_any_step():
    warnings.warn(END_EPOCH_BEFORE_ANY_STEP, RuntimeWarning, stacklevel=4)


class BucketedExchange:
    """Args:
        accordion: the ``horovod_accordion.core.schedule.Accordion`` schedule.
        reducer: the reducer of ``horovod_accordion.core.reducers`` that averages the gradients; the
            exchange runs on its backends, its ``tensors`` and its ``collectives``.
        params: the parameters, one per layer, in the order of ``accordion.layer_names``.
        loss_scale: called before each step's first bucket, returns the loss scale that the
            step's gradients carry (a device scalar of the backend), or ``None``; see
            ``horovod_accordion.torch_common.loss_scale``. Only read where it matters: for Δ or for a
            reducer's error feedback (a dense reducer averages the scaled gradients, as Horovod).
        sharding: a ``backends.Sharding``, where ``params`` are each rank's shards and the
            reducer's collectives span one shard's replicas; ``None``: every rank holds every
            layer whole.
    """

    def __init__(self, accordion, reducer, params, loss_scale=None, sharding: Optional[Sharding] = None):
        self.accordion, self.reducer = accordion, reducer
        self.loss_scale = loss_scale if accordion.keeps_delta or reducer.per_rank else None
        self.scale = None  # the loss scale of the step in progress
        # Checkpoints (``state_dict``) and a loss scale need the eager (torch) part of the contract;
        # TensorFlow's checkpoints are its variables, and it has no loss scale here.
        self.tensors: EagerTensorOps = reducer.tensors
        self.collectives: CollectiveOps = reducer.collectives
        self.world: CollectiveOps = sharding.world if sharding is not None else self.collectives
        self.shards = sharding.shards if sharding is not None else 1
        tensors = self.tensors
        accordion.attach(reducer)
        # The window's Δ and its non-finite counts; no Δ when nothing reads it.
        self.accumulated = [tensors.delta_like(p) for p in params] if accordion.keeps_delta else []
        # Whether the window now running adds to Δ: a level holder, so that a traced step (TF),
        # frozen at its tracing, reads it at run time; the exchange sets it as windows close.
        self.accumulating = tensors.level(accordion.window_accumulates, "window_accumulates") \
            if accordion.keeps_delta else None
        self.non_finite_counts = tensors.counters(len(params)) if accordion.adaptive else None
        self.started = {}  # bucket -> its BucketReduction, for the step in progress
        self.rates = RateAgreement(tensors, self.collectives) if self._agrees_lr() else None

    def observe_lr(self, lr):
        """Before a step's first bucket only: its later phases must run at the levels it
        started with, so a rate changed between backward and step counts from the next step.

        Where a decay would switch levels, the rate is agreed over ranks (``core.rates``): the
        rate last observed before a step's first bucket rides on that step's collectives, and
        the schedule sees it at the next observation, the same on every rank; where the ranks'
        rates differ, every rank raises. ``lr_decay_factor=None`` turns the rule and the
        agreement off."""
        if self.started:
            return
        if self.rates is not None:
            agreed = self.rates.agreed()
            if lr is not None:
                self.rates.observe(lr)
            lr = agreed
        if self.accordion.observe_lr(lr):
            self.accordion.apply_levels(self.reducer)

    def _agrees_lr(self):
        accordion = self.accordion
        return accordion.adaptive and accordion.detector.lr_decay_factor is not None and \
            accordion.policy.reads_norms and self.collectives.included()

    def start(self, bucket, layers, grads, divisor=None, reducer=None):
        """Start reducing ``grads``, the gradients of ``layers``; on the wire they are divided
        by ``divisor`` (the micro-batches of a large batch), in Δ they are not. ``reducer``
        replaces the compressing one for this bucket (DDP's plain allreduce before ``start_iter``)."""
        if not self.started:
            self.scale = self.loss_scale() if self.loss_scale is not None else None
        if self.scale is not None:
            grads = self.tensors.unscaled(grads, self.scale)
        if self.accordion.adaptive:
            self._observe(layers, grads)
        if divisor is not None:
            grads = [grad / divisor for grad in grads]
        def start():
            return (reducer or self.reducer).start(layers, grads, name=f".b{bucket}")
        carries = self.rates is not None and bucket == CARRYING_BUCKET
        self.started[bucket] = self.rates.carry(start) if carries else start()

    def _observe(self, layers, grads):
        """Read each gradient once for the detector: count each layer whose gradient is not
        finite (read once per window, so the step never waits on the device), and add the
        finite ones to Δ. A non-finite gradient (an overflow that a GradScaler will skip) stays
        out of Δ, so the next check stays finite."""
        tensors = self.tensors
        finite = tensors.finite_flags(grads)
        tensors.add_at(self.non_finite_counts, layers, tensors.false_as_ones(finite))
        if self.accumulated:
            def accumulate():
                for k, layer in enumerate(layers):
                    tensors.add_if(self.accumulated[layer], finite[k], grads[k])
            tensors.when(self.accumulating, accumulate)

    def load_schedule(self, schedule):
        """Restore the schedule's ``state_dict()``: its windows, hence whether this one adds to Δ."""
        self.accordion.load_state_dict(schedule)
        self.follow_schedule()

    def follow_schedule(self):
        """After the schedule's windows moved: say whether the window now running adds to Δ."""
        if self.accumulating is not None:
            self.tensors.set_level(self.accumulating, self.accordion.window_accumulates)

    def finish(self):
        """Every started bucket's averages, as ``{layer: average}``. The step is abandoned if a
        collective fails, so a retried step (elastic) starts clean."""
        try:
            outputs = BucketReduction.finish(list(self.started.values()))
            if self.rates is not None and CARRYING_BUCKET in self.started:
                self.rates.collectives_done()
        except BaseException:
            self.abandon_step()
            raise
        self.started = {}
        if self.scale is None:
            return outputs
        return {layer: self.tensors.scaled(average, self.scale) for layer, average in outputs.items()}

    def abandon_step(self):
        """A step failed, or state is restored: its buckets and whatever its collectives carried
        are dropped, on every rank alike, so that survivors and a joining worker go on alike."""
        self.started = {}
        if self.rates is not None:
            self.rates.abandon_step()

    def end_step(self, micro_batches=1, record=None, traffic=None):
        """Count the step and log its ``Traffic`` (by default what the collectives counted since
        the last step) and ``record``'s fields; close the window if the step completes one."""
        window_complete = self.accordion.step_done(micro_batches)
        traffic = self._take_traffic() if traffic is None else traffic
        self.accordion.log.record_step(self.accordion.step, traffic, **(record or {}))
        if window_complete:
            self.end_window()

    def end_epoch(self):
        """Close an epoch-long window: the user's ``end_epoch()``, on every backend. A process
        outside the process set exchanges nothing, and closes no window."""
        self.check_epoch_windows()
        if not self.collectives.included():
            return
        if self.started:
            # A check would switch levels under buckets whose later phases are still to run.
            raise RuntimeError("end_epoch() was called between backward and the optimizer step, while this "
                               "step's gradients are being exchanged: call it after optimizer.step()")
        if self.accordion.step == 0:  # the same on every rank: steps are collective
            warn_end_epoch_before_any_step()
            return
        self.end_window()

    def check_epoch_windows(self):
        """Refuse ``end_epoch()`` where windows are ``window_steps`` long; an adapter that runs
        steps' bookkeeping before it (TF's ``step_end``) asks first, before any collective."""
        check_epoch_windows(self.accordion.window_steps)

    def end_window(self):
        """Close a window: at a check, reduce each layer's squared norm of its Δ over ranks (see
        ``check_norm``), let the schedule decide and give the reducer the new levels; empty Δ
        after a check and after a window that feeds none. Warns about the layers with
        non-finite gradients in the window."""
        accordion, tensors, collectives, reducer = self.accordion, self.tensors, self.collectives, self.reducer
        empty = accordion.window_empties_delta
        # Sharded, the non-finite shards are counted over the world at a check, before the check
        # takes its bytes: a checkpoint between two checks then leaves no bytes pending. A policy
        # that reads no norms has no checks: its every window counts them.
        world_counts = self._non_finite_over_the_world() \
            if self.non_finite_counts is not None and self.world is not collectives \
            and (accordion.window_is_check or not accordion.policy.reads_norms) else None
        if accordion.window_is_check:
            if self.rates is not None and self.world is not collectives:
                self.rates.check_over(self.world)
            accumulated = self.accumulated
            # Each rank's own errors, before anything averages Δ: the table is averaged instead.
            errors = reducer.approximation_errors(accumulated, accordion.ladder) \
                if accordion.policy.measures_errors else None
            if accordion.check_norm == "local":
                local = tensors.squared_norms(accumulated)
                table = self._sum_over_shards(local if errors is None else tensors.concat([local, errors]), "norms")
                squared, errors = table[:len(accumulated)], table[len(accumulated):]
            else:
                if errors is not None:
                    errors = self._sum_over_shards(errors, "errors")
                # Δ is emptied after a check, so the collective may write the average into it.
                squared = tensors.squared_norms(collectives.allreduce_means(accumulated, "delta"))
                squared = self._sum_over_shards(squared, "norms") if self.world is not collectives \
                    else tensors.to_floats(squared)
            rungs = len(accordion.ladder)
            errors = {layer: errors[n * rungs:(n + 1) * rungs] for n, layer in enumerate(reducer.compressed)} \
                if errors else None
            traffic = self._take_traffic()
            decided = accordion.end_window(squared, errors=errors, bytes_sent=traffic.handed,
                                           wire_bytes_sent=traffic.wire)
        else:
            decided = accordion.end_window()
        if decided:
            accordion.apply_levels(reducer)
            if accordion.verify_levels:
                self.verify_same_levels()
        if empty:
            for total in self.accumulated:
                tensors.zero(total)
        self.follow_schedule()
        if self.non_finite_counts is not None and self.world is self.collectives:
            self._warn_non_finite(tensors.to_floats(tensors.read(self.non_finite_counts)))
            tensors.zero(self.non_finite_counts)
        elif world_counts is not None:
            self._warn_non_finite_shards(world_counts)
            tensors.zero(self.non_finite_counts)

    def _sum_over_shards(self, table, name):
        """Each entry of this rank's ``table`` summed over a layer's shards and averaged over
        its replicas: the world's mean × the shards (without sharding, the mean over ranks)."""
        averaged = self.tensors.to_floats(self.world.start_allreduce_mean(table, name).wait())
        return [self.shards * value for value in averaged]

    def _take_traffic(self):
        traffic = self.collectives.take_traffic()
        return traffic + self.world.take_traffic() if self.world is not self.collectives else traffic

    def _warn_non_finite(self, counts):
        accordion = self.accordion
        layers = [f"{name!r} ({int(n)} steps)" for name, n in zip(accordion.layer_names, counts) if n > 0]
        if layers:
            warnings.warn(
                f"rank {self.world.rank()}: non-finite gradients in the window that ended at step "
                f"{accordion.step}: "
                f"{', '.join(layers)}. They were averaged as Horovod would (a GradScaler skips those steps) "
                f"and left out of the detector's Δ, so they switch no level.", RuntimeWarning)

    def _non_finite_over_the_world(self):
        """Sharded, each rank counted its own shards, and one replica's overflow reaches some
        shards only: the counts summed over the world."""
        world = self.world
        counts = world.start_allreduce_mean(self.tensors.copy(self.non_finite_counts), "non_finite").wait()
        return [n * world.size() for n in self.tensors.to_floats(counts)]

    def _warn_non_finite_shards(self, counts):
        """Rank 0 warns once for the world, at a check, with the counts summed over it."""
        world, accordion = self.world, self.accordion
        layers = [f"{name!r} ({round(n)})" for name, n in zip(accordion.layer_names, counts) if round(n) > 0]
        if layers and world.rank() == 0:
            warnings.warn(
                f"non-finite gradient shards in the windows up to the check at step {accordion.step}, by layer (shards × "
                f"steps, over all ranks): {', '.join(layers)}. Each was averaged across its replicas as FSDP's own "
                f"all-reduce would (a GradScaler skips those steps) and left out of the detector's Δ, so they switch "
                f"no level.", RuntimeWarning)

    def verify_same_levels(self):
        """``verify_levels``: gather every rank's levels, step and window, and raise on every rank
        if any differ. All ranks see the same gathered rows, so they all raise or none does."""
        accordion, tensors, collectives = self.accordion, self.tensors, self.world
        mine = [float(level) for level in accordion.levels] + [float(accordion.step),
                                                               float(accordion.detector.windows_seen)]
        rows = tensors.to_floats(collectives.start_allgather(tensors.from_floats(mine), "verify_levels").wait())
        collectives.take_traffic()  # a debugging aid, not the algorithm's traffic
        if any(row != rows[0] for row in rows):
            ranks = [r for r, row in enumerate(rows) if row != rows[0]]
            names = accordion.layer_names
            layers = sorted({names[k] for row in rows for k in range(len(names)) if row[k] != rows[0][k]})
            raise RuntimeError(
                f"verify_levels: after the levels were decided at step {accordion.step}, rank(s) {ranks} of this "
                f"process set differ from its first rank (levels, step, window; rows {rows}); layers that differ: "
                f"{layers}")

    def kept_bytes(self):
        """The bytes of the state kept between steps (the reducer's and Δ), where the backend's
        tensors say their size (torch)."""
        holders = [h for entries in self.reducer.state().values() for h in entries.values()] + self.accumulated
        return sum(getattr(h, "nbytes", 0) for h in holders)

    def state_dict(self):
        """The schedule and the shared compression state (Q, levels), and in ``per_rank``
        what is this rank's own: error-feedback memory, TopK residuals and the window's Δ."""
        shared, per_rank = split_state(self.reducer)
        return {
            "schedule": self.accordion.state_dict(),
            "reducer": self.tensors.export_state(shared),
            "per_rank": {"rank": self.world.rank(), "size": self.world.size(),
                         "reducer": self.tensors.export_state(per_rank),
                         "accumulated": [self.tensors.copy(total) for total in self.accumulated]},
        }

    def check_compatible(self, saved, own=None):
        """Raise a ``ValueError`` that says what differs if ``saved`` is another configuration's
        (levels, layers, compression, shapes), before anything is loaded."""
        shared, per_rank = split_state(self.reducer)
        if set(saved["reducer"]) != set(shared):
            raise ValueError(f"the checkpoint's compression state {sorted(saved['reducer'])} is not this "
                             f"one's {sorted(shared)}: it was saved with another compression")
        self.accordion.check_compatible(saved["schedule"])
        _check_same_shapes(shared, saved["reducer"])
        mine = saved["per_rank"]
        if self._resolve_own(mine, own):
            _check_same_shapes(dict(per_rank, accumulated=dict(enumerate(self.accumulated))),
                               dict(mine["reducer"], accumulated=dict(enumerate(mine["accumulated"]))))

    def _resolve_own(self, mine, own):
        """``own``, or by default whether ``mine`` was saved on this rank at this world size."""
        here = (self.world.rank(), self.world.size())
        return (mine["rank"], mine["size"]) == here if own is None else own

    def load_state_dict(self, saved, own=None):
        """Restore a ``state_dict()``. Its per-rank part is restored if ``own`` (by default:
        saved on this rank, at this world size); else it restarts from zero, with a warning,
        and the shared part still resumes exactly."""
        # Everything is checked before anything is loaded: a mismatch leaves this state as it was.
        self.check_compatible(saved, own)
        shared, per_rank = split_state(self.reducer)
        mine = saved["per_rank"]
        own = self._resolve_own(mine, own)
        self.abandon_step()
        self.load_schedule(saved["schedule"])
        self.tensors.import_state(shared, saved["reducer"])
        self.reducer.restored()
        if own:
            self.tensors.import_state(per_rank, mine["reducer"])
            for total, saved_total in zip(self.accumulated, mine["accumulated"]):
                self.tensors.assign(total, saved_total)
            return
        warnings.warn(
            f"this checkpoint's error-feedback state (memory, residuals, the detection window's Δ and any "
            f"large batch in progress) is rank {mine['rank']}'s of {mine['size']}, not this rank's "
            f"({self.world.rank()} of {self.world.size()}): it restarts from zero here. Save one "
            f"state_dict per "
            f"rank to resume exactly.")
        for holder in [*(h for entries in per_rank.values() for h in entries.values()), *self.accumulated]:
            self.tensors.zero(holder)


def _check_same_shapes(groups, saved):
    """Raise a ``ValueError`` naming the first state entry whose layers or shape differ from
    the checkpoint's (a model or compression other than the one that saved it)."""
    for group, entries in groups.items():
        if set(saved[group]) != set(entries):
            raise ValueError(f"the checkpoint's {group} covers layers {sorted(saved[group])}, this model's covers "
                             f"{sorted(entries)}: it was saved from another model or compression")
        for i, holder in entries.items():
            ours, theirs = tuple(getattr(holder, "shape", ())), tuple(getattr(saved[group][i], "shape", ()))
            if ours != theirs:
                raise ValueError(f"the checkpoint's {group} of layer {i} has shape {theirs}, this model's has {ours}: "
                                 f"it was saved from another model or compression")
