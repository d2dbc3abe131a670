"""What the study's training programs share (``pytorch_train.py``, ``transformer_lm.py``): the
compression arguments, the level policy, and rank 0's JSONL record of the run."""
import json

import horovod_accordion.torch as hvd


def add_compression_arguments(parser, levels):
    """``--compression``, ``--levels`` (default ``levels``), ``--policy`` and ``--slack``."""
    parser.add_argument("--compression", choices=["none", "fp16", "powersgd", "topk", "quantized"], default="powersgd")
    parser.add_argument("--levels", type=float, nargs="+", metavar="LEVEL", default=levels,
                        help="ℓ_low and ℓ_high: PowerSGD ranks, TopK kept fractions or quantized bits (a ladder "
                             "for --policy)")
    parser.add_argument("--policy", choices=["accordion", "error_budget", "phase"], default="accordion",
                        help="how the levels are chosen from --levels: see horovod_accordion.core.policies")
    parser.add_argument("--slack", type=float, default=2.0, help="error_budget: the error allowed over ℓ_low's")


def compression_of(args):
    low, high = args.levels[0], args.levels[-1]
    if args.compression == "powersgd":
        return hvd.Compression.powersgd(int(low), int(high), seed=args.seed,
                                        ladder=tuple(int(level) for level in args.levels))
    if args.compression == "topk":
        return hvd.Compression.topk(low, high, ladder=tuple(args.levels))
    if args.compression == "quantized":
        return hvd.Compression.quantized(int(low), int(high), ladder=tuple(int(level) for level in args.levels))
    return {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[args.compression]


def policy_of(args, total_windows):
    """The level policy; the phase schedule walks the ladder down over ``total_windows``."""
    if args.policy == "phase":
        return hvd.PhaseSchedule(total_windows=total_windows)
    return hvd.ErrorBudget(slack=args.slack) if args.policy == "error_budget" else "accordion"


class RunRecord:
    """Rank 0's ``--record``: one JSON line per record, flushed as written, so a run that dies
    keeps what it wrote; the study counts a run only once its ``done`` line is there."""

    def __init__(self, path, rank):
        self.rank = rank
        self.file = open(path, "w") if path and rank == 0 else None
        self.checks_written = 0

    def write(self, record):
        if self.file:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def write_new_checks(self, stats, epoch):
        """The checks and decays since the last call, from ``optimizer.accordion_stats()``."""
        for event in stats["checks"][self.checks_written:]:
            self.write({**event, "epoch": epoch})
        self.checks_written = len(stats["checks"])

    def finish(self, record, keys, compression, score):
        """The ``done`` line, with the last epoch's ``keys`` (the study reads them), and rank 0's
        result line, where ``score`` says the score in words."""
        self.write({"event": "done", **{key: record[key] for key in keys}})
        if self.file:
            self.file.close()
        if self.rank == 0:
            print(f"[rank 0] {compression}: {score}, {record['bytes_sent_per_rank'] / 1e6:.2f} MB sent per rank "
                  f"({record['wire_bytes_sent_per_rank'] / 1e6:.2f} MB on its link), "
                  f"{record['wall_time_s']:.1f} s", flush=True)


def show_epoch(bar, record, **score):
    """The progress line's fields: the training loss, ``score``, MB sent and the levels now."""
    bar.set_postfix(loss=record["loss"], **score, MB=round(record["bytes_sent_per_rank"] / 1e6, 2),
                    levels=",".join(str(level) for level in record["levels"].values()))
