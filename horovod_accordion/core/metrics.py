"""What the optimizer reports: the bytes each rank sent per step (those it handed to collectives,
and those that crossed its link), and each layer's level per check, as a dict, as JSONL and,
optionally, as TensorBoard scalars."""

import collections
import json
import os

__all__ = ["CommunicationLog"]

# How many of the last steps keep their bytes and fields in memory: a run of any length holds
# this many, and the totals count every step.
HISTORY_STEPS = 10_000


class CommunicationLog:
    """Per-step traffic and per-check decisions, as a dict and optionally as JSONL.

    ``path``: a JSONL file that every record is appended to, or ``None``; opened once, and each
    record flushed as it is written, so a crash loses none.
    ``scalars``: a TensorBoard writer with ``add_scalar(tag, value, step)`` and ``flush()``
    (``torch.utils.tensorboard.SummaryWriter``, or the TensorFlow adapter's), or ``None``.
    """

    def __init__(self, path=None, scalars=None):
        self.path = path
        self.scalars = scalars
        self.bytes_per_step = collections.deque(maxlen=HISTORY_STEPS)
        self.wire_bytes_per_step = collections.deque(maxlen=HISTORY_STEPS)
        self.steps_extra = collections.deque(maxlen=HISTORY_STEPS)
        self.checks = []
        self.steps = 0
        self.step_bytes_sent = 0  # over every step, also those no longer in ``bytes_per_step``
        self.step_wire_bytes_sent = 0
        self._stream = None

    @classmethod
    def on_rank(cls, rank, path=None, tensorboard_dir=None, writer=None):
        """The log of one rank. Decisions are identical on every rank, so rank 0 alone writes
        the JSONL file and the scalars, through ``writer(tensorboard_dir)``."""
        if rank != 0:
            return cls()
        return cls(path, None if tensorboard_dir is None else writer(tensorboard_dir))

    def record_step(self, step, traffic, **extra):
        """``traffic``: the step's ``collectives.Traffic``."""
        handed, wire = int(traffic.handed), int(traffic.wire)
        self.steps += 1
        self.step_bytes_sent += handed
        self.step_wire_bytes_sent += wire
        self.bytes_per_step.append(handed)
        self.wire_bytes_per_step.append(wire)
        self.steps_extra.append(extra)
        self._write({"event": "step", "step": step, "bytes_sent": handed, "wire_bytes_sent": wire, **extra})
        if self.scalars is not None:
            self.scalars.add_scalar("accordion/bytes_per_step", handed, step)
            self.scalars.add_scalar("accordion/wire_bytes_per_step", wire, step)

    def record_check(self, step, window, levels, ratios, norms, **extra):
        record = {"event": "check", "step": step, "window": window, "levels": dict(levels),
                  "ratios": dict(ratios), "norms": dict(norms), **extra}
        self.checks.append(record)
        self._write(record)
        if self.scalars is not None:
            for name, level in record["levels"].items():
                self.scalars.add_scalar(f"accordion/level/{name}", level, step)
            for name, ratio in record["ratios"].items():
                if ratio is not None:
                    self.scalars.add_scalar(f"accordion/ratio/{name}", ratio, step)
            self.scalars.flush()

    def record_decay(self, step, lr, levels):
        """A learning-rate decay event: every layer went to ℓ_low."""
        record = {"event": "lr_decay", "step": step, "lr": lr, "levels": dict(levels)}
        self.checks.append(record)
        self._write(record)

    def as_dict(self):
        """``bytes_per_step``, ``wire_bytes_per_step`` and ``steps_extra`` cover the last
        ``HISTORY_STEPS`` steps; ``steps``, ``total_bytes_sent`` and ``total_wire_bytes_sent``
        every step. ``bytes``: handed to the collectives; ``wire_bytes``: across the rank's link,
        as ``collectives.wire_share`` counts them (a ring allreduce 2(W − 1)/W of its buffer, an
        all-gather W − 1 times the rank's part, an all-to-all (W − 1)/W)."""
        return {
            "steps": self.steps,
            "bytes_per_step": list(self.bytes_per_step),
            "wire_bytes_per_step": list(self.wire_bytes_per_step),
            "total_bytes_sent": self.step_bytes_sent + sum(c.get("bytes_sent", 0) for c in self.checks),
            "total_wire_bytes_sent": self.step_wire_bytes_sent + sum(c.get("wire_bytes_sent", 0) for c in self.checks),
            "steps_extra": list(self.steps_extra),
            "checks": list(self.checks),
        }

    def _write(self, record):
        if self.path is None:
            return
        if self._stream is None or self._stream.name != os.fspath(self.path):
            self.close()
            self._stream = open(self.path, "a")
        self._stream.write(json.dumps(record) + "\n")
        self._stream.flush()

    def close(self):
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def __getstate__(self):
        """Pickled (an elastic or Ray copy of a state) without its open file, which it reopens."""
        return dict(self.__dict__, _stream=None)
