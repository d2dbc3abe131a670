"""One optimizer step's gradient exchange, bucket by bucket, for the backends whose
gradients come out of backward in buckets: Horovod's torch optimizer (from its gradient
hooks) and torch DDP (from its communication hook).

Each bucket is started as soon as its gradients are in: the detector's Δ and non-finite
counts take their share, and the reducer's first phase goes on the wire while backward
goes on. ``finish`` runs the remaining phases of every started bucket, and ``end_step``
counts the step and closes a window when one is complete. The adapters only say when a
bucket is ready and where the averages go.
"""

import warnings

from horovod_accordion.reducers import BucketReduction, split_state

__all__ = ["BucketedExchange"]


class BucketedExchange:
    """Args:
        accordion: the :class:`horovod_accordion.accordion.Accordion` schedule.
        reducer: the reducer of ``horovod_accordion.reducers`` that averages the gradients.
        ops: the backend, whose collectives the reducer calls.
        params: the parameters, one per layer, in the order of ``accordion.layer_names``.
    """

    def __init__(self, accordion, reducer, ops, params):
        self.accordion, self.reducer, self.ops = accordion, reducer, ops
        accordion.attach(reducer)
        # The window's Δ and its non-finite counts; no Δ when nothing reads it.
        self.accumulated = [ops.delta_like(p) for p in params] if accordion.keeps_delta else []
        self.non_finite_counts = ops.counters(len(params)) if accordion.adaptive else None
        self.started = {}  # bucket -> its BucketReduction, for the step in progress

    def observe_lr(self, lr):
        """Before a step's first bucket only: its later phases must run at the levels it
        started with, so a rate changed between backward and step counts from the next step."""
        if not self.started and self.accordion.observe_lr(lr):
            self.reducer.set_levels(self.accordion.levels)

    def start(self, bucket, layers, grads, divisor=1, reducer=None):
        """Start reducing ``grads``, the gradients of ``layers``; on the wire they are divided
        by ``divisor`` (the micro-batches of a large batch), in Δ they are not. ``reducer``
        replaces the compressing one for this bucket (DDP's plain allreduce before ``start_iter``)."""
        accordion = self.accordion
        if accordion.adaptive:
            accumulated = [self.accumulated[layer] for layer in layers] if accordion.window_accumulates else None
            accordion.observe_gradients(self.ops, grads, self.non_finite_counts, accumulated, layers)
        if divisor != 1:
            grads = [grad / divisor for grad in grads]
        self.started[bucket] = (reducer or self.reducer).start(layers, grads, name=f".b{bucket}")

    def finish(self):
        """Every started bucket's averages, as ``{layer: average}``. The step's buckets are
        dropped even if a collective fails, so a retried step (elastic) starts clean."""
        try:
            return BucketReduction.finish(list(self.started.values()))
        finally:
            self.started = {}

    def end_step(self, micro_batches=1, record=None):
        """Count the step and log its bytes (and ``record``'s fields); close the window if the
        step completes one."""
        window_complete = self.accordion.step_done(micro_batches)
        self.accordion.log.record_step(self.accordion.step, self.ops.take_bytes_sent(), **(record or {}))
        if window_complete:
            self.end_window()

    def end_epoch(self):
        """Close an epoch-long window: the user's ``end_epoch()``, on every backend."""
        window_steps = self.accordion.window_steps
        if window_steps is not None:
            raise RuntimeError(f"this exchange closes its windows every {window_steps} steps by itself; "
                               f"end_epoch() is for window_steps=None")
        if self.started:
            # A check would switch levels under buckets whose later phases are still to run.
            raise RuntimeError("end_epoch() was called between backward and the optimizer step, while this "
                               "step's gradients are being exchanged: call it after optimizer.step()")
        self.end_window()

    def end_window(self):
        self.accordion.close_window(self.reducer, self.ops, self.accumulated, self.non_finite_counts)

    def state_dict(self):
        """The schedule and the shared compression state (Q, levels), and in ``per_rank``
        what is this rank's own: error-feedback memory, TopK residuals and the window's Δ."""
        shared, per_rank = split_state(self.reducer)
        return {
            "schedule": self.accordion.state_dict(),
            "reducer": self.ops.export_state(shared),
            "per_rank": {"rank": self.ops.rank(), "size": self.ops.size(),
                         "reducer": self.ops.export_state(per_rank),
                         "accumulated": [self.ops.copy(total) for total in self.accumulated]},
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
        return (mine["rank"], mine["size"]) == (self.ops.rank(), self.ops.size()) if own is None else own

    def load_state_dict(self, saved, own=None):
        """Restore a ``state_dict()``. Its per-rank part is restored if ``own`` (by default:
        saved on this rank, at this world size); else it restarts from zero, with a warning,
        and the shared part still resumes exactly."""
        # Everything is checked before anything is loaded: a mismatch leaves this state as it was.
        self.check_compatible(saved, own)
        shared, per_rank = split_state(self.reducer)
        mine = saved["per_rank"]
        own = self._resolve_own(mine, own)
        self.accordion.load_state_dict(saved["schedule"])
        self.ops.import_state(shared, saved["reducer"])
        if own:
            self.ops.import_state(per_rank, mine["reducer"])
            for total, saved_total in zip(self.accumulated, mine["accumulated"]):
                self.ops.assign(total, saved_total)
            return
        warnings.warn(
            f"this checkpoint's error-feedback state (memory, residuals, the detection window's Δ and any "
            f"large batch in progress) is rank {mine['rank']}'s of {mine['size']}, not this rank's "
            f"({self.ops.rank()} of {self.ops.size()}): it restarts from zero here. Save one state_dict per "
            f"rank to resume exactly.")
        for holder in [*(h for entries in per_rank.values() for h in entries.values()), *self.accumulated]:
            self.ops.zero(holder)


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
