"""What the optimizer reports: bytes on the wire per step, and each layer's level per check,
as a dict, as JSONL and, optionally, as TensorBoard scalars."""

import json

__all__ = ["CommunicationLog"]


class CommunicationLog:
    """Per-step traffic and per-check decisions, as a dict and optionally as JSONL.

    ``path``: a JSONL file that every record is appended to, or ``None``.
    ``scalars``: a TensorBoard writer with ``add_scalar(tag, value, step)`` and ``flush()``
    (``torch.utils.tensorboard.SummaryWriter``, or the TensorFlow adapter's), or ``None``.
    """

    def __init__(self, path=None, scalars=None):
        self.path = path
        self.scalars = scalars
        self.bytes_per_step = []
        self.steps_extra = []
        self.checks = []

    @classmethod
    def on_rank(cls, rank, path=None, tensorboard_dir=None, writer=None):
        """The log of one rank. Decisions are identical on every rank, so rank 0 alone writes
        the JSONL file and the scalars, through ``writer(tensorboard_dir)``."""
        if rank != 0:
            return cls()
        return cls(path, None if tensorboard_dir is None else writer(tensorboard_dir))

    def record_step(self, step, bytes_sent, **extra):
        self.bytes_per_step.append(int(bytes_sent))
        self.steps_extra.append(extra)
        self._write({"event": "step", "step": step, "bytes_sent": int(bytes_sent), **extra})
        if self.scalars is not None:
            self.scalars.add_scalar("accordion/bytes_per_step", int(bytes_sent), step)

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
        return {
            "steps": len(self.bytes_per_step),
            "bytes_per_step": list(self.bytes_per_step),
            "total_bytes_sent": sum(self.bytes_per_step) + sum(c.get("bytes_sent", 0) for c in self.checks),
            "steps_extra": list(self.steps_extra),
            "checks": list(self.checks),
        }

    def _write(self, record):
        if self.path is not None:
            with open(self.path, "a") as stream:
                stream.write(json.dumps(record) + "\n")
