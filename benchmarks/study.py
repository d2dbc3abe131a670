"""Accordion's accuracy-versus-traffic study: real ``horovodrun`` jobs, one per setting × seed.

    python benchmarks/study.py --dataset mnist1d --model cnn1d --seeds 0 1 2 3 4
    python benchmarks/study.py --dataset cifar10 --data-dir /data --model cnn2d --seeds 0 1 2
    python benchmarks/study.py --setting stdlib-transformer --workers 2 --epochs 30 \
        --powersgd-levels 16 4 --powersgd-ladder 16 8 4 --seeds 0 1 2 [--optimizer sgd] [--precision bf16]

Each run is ``examples/pytorch_train.py`` (the transformer: ``examples/transformer_lm.py``,
whose epochs are windows of steps, scored by validation loss) on ``--workers`` Gloo ranks;
its per-epoch JSONL record goes to ``benchmarks/results/study/SETTING/runs/ROW/seedK.jsonl``
(the transformer's SETTING names its recipe: ``stdlib-transformer-adamw-fp32``). A run whose
record ends with its ``done`` line is not run again, so a study can be spread over several
invocations (and stopped at any time). After the runs, the study writes ``summary.json``,
``summary.md``, the PNGs and TensorBoard's scalars (``tensorboard/ROW/seedK``) into the
setting's folder, from every finished run.

``--rows`` picks rows by name (``family/setting/variant``, shell patterns allowed); the
default is the main rows of every family, then the detector's levers.
"""
import argparse
import fnmatch
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import time
from typing import NamedTuple

from tqdm import tqdm

from horovod_accordion.tools import plot

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "study"


class Program(NamedTuple):
    """A setting's training program and how the study drives and scores it."""
    path: pathlib.Path
    length: str  # the argument of the run's length
    metric: str  # of the ``done`` record: a key of ``plot.METRICS``
    levers: bool  # has the batch switch and the detector's levers


CLASSIFIER = Program(REPO / "examples" / "pytorch_train.py", "--epochs", "test_accuracy", True)
TRANSFORMER = Program(REPO / "examples" / "transformer_lm.py", "--windows", "validation_loss", False)

LEVERS = {  # variant name: the extra arguments of the Accordion row
    "interval=1": ["--interval", "1"],
    "interval=4": ["--interval", "4"],
    "whole-model": ["--whole-model"],
    "delta-windows=2": ["--delta-windows", "2"],
    "check-norm=averaged": ["--check-norm", "averaged"],
}


def rows_of(args):
    """Every row of a setting: (family, setting, variant, levels, run name, train arguments).
    Rows with the same arguments share their runs (uncompressed and fp16 are every family's
    references). The policies other than Accordion's choose from the family's ladder."""
    config = {"powersgd": args.powersgd_levels, "topk": args.topk_levels, "quantized": args.quantized_levels,
              "batch": (1, args.batch_multiplier)}
    ladders = {"powersgd": args.powersgd_ladder, "topk": args.topk_ladder, "quantized": args.quantized_ladder}
    uncompressed = ("uncompressed", ["--compression", "none"])
    fp16 = ("fp16", ["--compression", "fp16"])
    rows = []
    for family in ("powersgd", "topk", "quantized"):
        low, high = config[family]
        levels = ["--compression", family, "--levels"]
        ladder = [f"{level:g}" for level in ladders[family]]
        rows += [(family, "uncompressed", "default", [None, None], *uncompressed),
                 (family, "fp16", "default", [None, None], *fp16),
                 (family, "low", "default", [low, low], f"{family}-low", levels + [str(low), str(low)]),
                 (family, "high", "default", [high, high], f"{family}-high", levels + [str(high), str(high)]),
                 (family, "accordion", "default", [low, high], f"{family}-accordion",
                  levels + [str(low), str(high)])]
        rows += [(family, policy, "default", list(ladders[family]), f"{family}-{policy.replace('_', '-')}",
                  levels + ladder + ["--policy", policy]) for policy in ("error_budget", "phase")]
        if family == "quantized":  # each bits of the ladder alone, as the static low and high rows
            rows += [(family, f"static {level}", "default", [level, level], f"{family}-static-{level}",
                      levels + [str(level), str(level)]) for level in ladders[family] if level not in (low, high)]
    if not args.program.levers:
        return rows
    small, multiplier = config["batch"][0], config["batch"][1]
    batch = ["--compression", "none", "--batch-switch", str(multiplier)]
    rows += [("batch", "small", "default", [small, small], *uncompressed),
             ("batch", "large", "default", [multiplier, multiplier], "batch-large", batch + ["--large-batch"]),
             ("batch", "accordion", "default", [small, multiplier], "batch-accordion", batch)]
    for family in ("powersgd", "topk"):
        low, high = config[family]
        for variant, extra in LEVERS.items():
            rows.append((family, "accordion", variant, [low, high], f"{family}-accordion-{variant}",
                         ["--compression", family, "--levels", str(low), str(high)] + extra))
    return rows


def wire_bytes(done, family, setting, workers):
    """The bytes that crossed a rank's link over a run: its record's, or, for a record made before
    they were counted (no all-to-all then), its handed-over bytes × 2(W − 1)/W where every
    collective of the run was a ring allreduce (uncompressed, fp16, PowerSGD, batch switching), and
    × 1 at W = 2, where an allreduce and an allgather both carry what each rank hands over; else
    ``None``: an older TopK run's allgathers carry W − 1 times what each rank hands over."""
    if "wire_bytes_sent_per_rank" in done:
        return done["wire_bytes_sent_per_rank"]
    if workers == 2:
        return done["bytes_sent_per_rank"]
    if family == "topk" and setting not in ("uncompressed", "fp16"):
        return None
    return done["bytes_sent_per_rank"] * 2 * (workers - 1) / workers


def _mean_or_none(values):
    return None if any(value is None for value in values) else _mean(values)


def row_name(row):
    return "/".join(row[:3])


def finished(path):
    """A run counts only when its record is complete: its last line is ``done``."""
    try:
        lines = pathlib.Path(path).read_text().splitlines()
    except FileNotFoundError:
        return None
    records = [json.loads(line) for line in lines if line.strip()]
    return records if records and records[-1]["event"] == "done" else None


def worker_env():
    env = dict(os.environ)
    # Horovod's 1 ms default cycle time dominates a step of these small models.
    env.update({"OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "HOROVOD_CYCLE_TIME": "0.2",
                "PATH": str(pathlib.Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")})
    return env


def run_once(command, log_path, timeout):
    """One horovodrun job; its output goes beside its record. The record is renamed into
    place only when complete, so an interrupted run is simply run again."""
    partial = log_path.with_suffix(".partial")
    with open(log_path.with_suffix(".out"), "w") as output:
        process = subprocess.Popen(command + ["--record", str(partial)], cwd=REPO / "examples", env=worker_env(),
                                   stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
    if process.returncode == 0 and finished(partial):
        partial.replace(log_path)
        return True
    return False


def run_arguments(args, row):
    """The training program's arguments for ``row``, but the seed's."""
    if args.program is TRANSFORMER:
        setting = ["--optimizer", args.optimizer, "--precision", args.precision]
    else:
        setting = ["--dataset", args.dataset, "--model", args.model,
                   *(["--data-dir", args.data_dir] if args.data_dir else [])]
    return [*setting, args.program.length, str(args.epochs), *row[5]]


def check_runs_match(args, rows):
    """Refuse a finished run that another command made (other levels, workers or length under
    the same run name), before anything runs: the study would skip it, and its summary would
    label it with this command's settings."""
    folder = args.results / args.setting
    mismatches = []
    for row in rows:
        expected = _flags(run_arguments(args, row))
        expected["workers"] = [str(args.workers)]
        for path in sorted((folder / "runs" / row[4]).glob("seed*.jsonl")):
            records = finished(path)
            differ = records and {key: records[0].get(key) for key, want in expected.items()
                                  if not _same(records[0].get(key), want)}
            if differ:
                mismatches.append(f"{path}: {differ}, where this command asks for "
                                  f"{ {key: expected[key] for key in differ} }")
    if mismatches:
        raise SystemExit("finished runs made with other settings (pass another --results, or move them away):\n"
                         + "\n".join(mismatches))


def _flags(tokens):
    """``["--levels", "16", "16", "--whole-model"]`` as ``{"levels": ["16", "16"], "whole_model": []}``."""
    flags, key = {}, None
    for token in tokens:
        if token.startswith("--"):
            key = token[2:].replace("-", "_")
            flags[key] = []
        else:
            flags[key].append(token)
    return flags


def _same(recorded, tokens):
    """Whether a run's recorded argument is what ``tokens`` ask for (a switch: ``True``)."""
    if not tokens:
        return recorded is True
    values = recorded if isinstance(recorded, list) else [recorded]
    if len(values) != len(tokens):
        return False
    for value, token in zip(values, tokens):
        try:
            if float(value) != float(token):
                return False
        except (TypeError, ValueError):
            if str(value) != token:
                return False
    return True


def run_study(args, rows):
    folder = args.results / args.setting
    horovodrun = str(pathlib.Path(sys.executable).parent / "horovodrun")
    todo = []
    for seed in args.seeds:  # seed-major, so a study stopped early has every row at the same seeds
        for row in rows:
            path = folder / "runs" / row[4] / f"seed{seed}.jsonl"
            if path not in [p for p, _ in todo] and not finished(path):
                command = [horovodrun, "-np", str(args.workers), "--gloo", sys.executable, str(args.program.path),
                           *run_arguments(args, row), "--seed", str(seed), "--no-progress"]
                todo.append((path, command))
    print(f"runs to do: {len(todo)}", flush=True)
    failures = []
    for path, command in tqdm(todo, desc=f"study {args.setting}", unit="run"):
        path.parent.mkdir(parents=True, exist_ok=True)
        if not run_once(command, path, args.timeout):
            failures.append(str(path.with_suffix(".out")))
    return failures


def summarize(args, rows, command):
    """Summarize every finished run of the setting. ``command`` is recorded with those of the
    earlier invocations whose runs the summary holds (``commands.txt``)."""
    folder = args.results / args.setting
    folder.mkdir(parents=True, exist_ok=True)
    history = folder / "commands.txt"
    commands = history.read_text().splitlines() if history.exists() else []
    if command not in commands and not args.summarize_only:
        commands.append(command)
        history.write_text("\n".join(commands) + "\n")
    metric = args.program.metric
    digits = plot.METRICS[metric].decimals + 1  # one more than the tables show
    summary_rows, curves, config = [], {}, None
    for row in rows:
        family, setting, variant, levels, run, _ = row
        runs = {}
        for path in sorted((folder / "runs" / run).glob("seed*.jsonl")):
            records = finished(path)
            if records:
                runs[int(path.stem[4:])] = records
        if not runs:
            continue
        config = config or runs[min(runs)][0]
        for seed in runs:
            write_tensorboard(folder / "tensorboard" / run / f"seed{seed}", folder / "runs" / run / f"seed{seed}.jsonl",
                              runs[seed], metric)
        done = [records[-1] for records in runs.values()]
        scores = [r[metric] for r in done]
        summary_rows.append({
            "family": family, "setting": setting, "variant": variant, "levels": levels,
            "seeds": sorted(runs), f"{metric}_mean": round(_mean(scores), digits),
            f"{metric}_std": round(_std(scores), digits),
            "bytes_per_rank_mean": _mean([r["bytes_sent_per_rank"] for r in done]),
            "wire_bytes_per_rank_mean": _mean_or_none([wire_bytes(r, family, setting, args.workers) for r in done]),
            "wall_time_s_mean": round(_mean([r["wall_time_s"] for r in done]), 1)})
        if len(set(levels)) > 1 and config.get("layer_types"):
            summary_rows[-1].update(levels_by_layer_type(runs.values(), config["layer_types"], levels[0]))
        curves[row_name(row)] = [[e[metric] for e in records if e["event"] == "epoch"]
                                 for records in runs.values()]
    reference = {r["family"]: r["wire_bytes_per_rank_mean"] for r in summary_rows
                 if r["setting"] in ("low", "small") and r["variant"] == "default"}
    uncompressed = next((r[f"{metric}_mean"] for r in summary_rows if r["setting"] in ("uncompressed", "small")), None)
    for r in summary_rows:
        r["bytes_vs_low"] = round(r["wire_bytes_per_rank_mean"] / reference[r["family"]], 3) \
            if reference.get(r["family"]) and r["wire_bytes_per_rank_mean"] is not None else None
        r["distance_to_uncompressed"] = None if uncompressed is None \
            else round(r[f"{metric}_mean"] - uncompressed, digits)
    summary = {"command": " && ".join(commands), "dataset": args.dataset, "model": args.model,
               "workers": args.workers, "epochs": args.epochs, "rows": summary_rows}
    if args.program is TRANSFORMER:
        summary.update({"metric": metric, "optimizer": args.optimizer, "precision": args.precision,
                        "data": config and config["data"],
                        "recipe": config and {key: config[key] for key in (
                            "steps_per_window", "batch_size", "context", "width", "layers", "heads", "lr",
                            "warmup_steps", "weight_decay", "interval")}})
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    pngs = plot.study_figures(summary, curves, folder)
    if any("mean_level_by_layer_type" in r for r in summary_rows):
        pngs += plot.layer_type_figures(summary, curves, folder)
    example = folder / "runs" / "powersgd-accordion" / f"seed{args.seeds[0]}.jsonl"
    if finished(example):
        pngs += plot.run_figures(example, folder, prefix="powersgd-accordion-")
    (folder / "summary.md").write_text(summary_markdown(summary, pngs))
    return summary


def write_tensorboard(log_dir, record_path, records, metric):
    """One run's epochs as TensorBoard scalars: the score, the bytes, the rate and each
    layer's level (``tensorboard --logdir SETTING/tensorboard`` compares the rows). Written
    once per record: again only if the run was run again (a run shared by several families
    is summarized once per family)."""
    written = list(pathlib.Path(log_dir).glob("events.out.tfevents.*"))
    if written and all(path.stat().st_mtime >= record_path.stat().st_mtime for path in written):
        return
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is in the dev extra only
        print(f"no TensorBoard scalars for {record_path}: pip install tensorboard", file=sys.stderr)
        return
    shutil.rmtree(log_dir, ignore_errors=True)
    with SummaryWriter(log_dir) as writer:
        for record in records:
            if record["event"] == "epoch":
                for tag in (metric, "bytes_sent_per_rank", "lr"):
                    writer.add_scalar(tag, record[tag], record["epoch"])
                for name, level in record["levels"].items():
                    if level is not None:  # logs of 0.2.0 list None for the layers none and fp16 leave whole
                        writer.add_scalar(f"level/{name}", level, record["epoch"])


def levels_by_layer_type(runs, layer_types, low):
    """Which level an adaptive row chose for each layer type (of the compressed layers):
    the mean level per epoch over the type's layers and the seeds, and the share of the
    (layer, epoch) pairs at ℓ_low."""
    by_type = {}
    for records in runs:
        epochs = [r["levels"] for r in records if r["event"] == "epoch"]
        for name in epochs[0]:
            by_type.setdefault(layer_types[name], []).append([levels[name] for levels in epochs])
    return {"mean_level_by_layer_type": {kind: [round(_mean(column), 2) for column in zip(*series)]
                                         for kind, series in by_type.items()},
            "low_share_by_layer_type": {kind: round(_mean([level == low for one in series for level in one]), 3)
                                        for kind, series in by_type.items()}}


def summary_markdown(summary, pngs):
    metric = summary.get("metric", "test_accuracy")
    column, digits = plot.METRICS[metric].label, plot.METRICS[metric].decimals
    recipe = f", {summary['optimizer']}, {summary['precision']}" if "optimizer" in summary else ""
    lines = [f"# {summary['dataset']} / {summary['model']}{recipe}: {summary['workers']} workers, "
             f"{summary['epochs']} epochs", "", f"Command: `{summary['command']}`", "",
             f"The final {column}, mean ± std over the seeds, and its distance to uncompressed; the bytes that "
             "crossed each rank's link over the whole run (gradients and Accordion's norm reductions; a ring "
             "allreduce carries 2(W − 1)/W of its buffer, an allgather W − 1 times each rank's part, an "
             "all-to-all (W − 1)/W; – for a TopK run recorded before wire bytes were), and those each rank handed "
             "to the collectives; the wire bytes' ratio to static ℓ_low (small batch for the batch family); the "
             "training time per run.", "",
             f"| family | setting | variant | levels | seeds | {column} | − uncompressed | wire MB per rank "
             "| MB handed over | bytes vs ℓ_low | train time (s) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        levels = "–" if r["levels"][0] is None else "/".join(f"{level:g}" for level in r["levels"])
        ratio = "–" if r["bytes_vs_low"] is None else f"{r['bytes_vs_low']:.2f}×"
        distance = "–" if r["distance_to_uncompressed"] is None else f"{r['distance_to_uncompressed']:+.{digits}f}"
        wire = "–" if r.get("wire_bytes_per_rank_mean") is None else f"{r['wire_bytes_per_rank_mean'] / 1e6:.2f}"
        lines.append(f"| {r['family']} | {r['setting']} | {r['variant']} | {levels} | {len(r['seeds'])} | "
                     f"{r[metric + '_mean']:.{digits}f} ± {r[metric + '_std']:.{digits}f} | {distance} | {wire} | "
                     f"{r['bytes_per_rank_mean'] / 1e6:.2f} | {ratio} | {r['wall_time_s_mean']:.0f} |")
    shares = [r for r in summary["rows"] if "low_share_by_layer_type" in r]
    if shares:
        kinds = list(shares[0]["low_share_by_layer_type"])
        lines += ["", "Share of the (layer, epoch) pairs each adaptive row spent at ℓ_low, per layer type:", "",
                  "| family | setting | " + " | ".join(kinds) + " |", "|---|---|" + "---|" * len(kinds)]
        lines += [f"| {r['family']} | {r['setting']} | " + " | ".join(
            f"{r['low_share_by_layer_type'][kind]:.2f}" for kind in kinds) + " |" for r in shares]
    lines += ["", *[f"![{png.stem}]({png.name})" for png in pngs], ""]
    return "\n".join(lines)


def _mean(values):
    return sum(values) / len(values)


def _std(values):
    """The sample standard deviation over seeds (0 for a single seed)."""
    if len(values) < 2:
        return 0.0
    mean = _mean(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="mnist1d", help="as examples/pytorch_train.py takes it")
    parser.add_argument("--model", default="cnn1d", help="as examples/pytorch_train.py takes it")
    parser.add_argument("--data-dir", help="for cifar10: the folder holding cifar-10-batches-py")
    parser.add_argument("--setting", help="shorthand for DATASET-MODEL, e.g. mnist1d-cnn1d-wide or stdlib-transformer")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw", help="the transformer's")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="the transformer's")
    parser.add_argument("--powersgd-levels", type=int, nargs=2, default=(4, 1), metavar=("LOW", "HIGH"))
    parser.add_argument("--topk-levels", type=float, nargs=2, default=(0.5, 0.1), metavar=("LOW", "HIGH"))
    parser.add_argument("--powersgd-ladder", type=int, nargs="+", default=(4, 2, 1), help="for the policies' rows")
    parser.add_argument("--topk-ladder", type=float, nargs="+", default=(0.5, 0.25, 0.1), help="for the policies' rows")
    parser.add_argument("--quantized-levels", type=int, nargs=2, default=(8, 4), metavar=("LOW", "HIGH"), help="bits")
    parser.add_argument("--quantized-ladder", type=int, nargs="+", default=(8, 4, 2),
                        help="for the policies' rows, and a static row for each bits")
    parser.add_argument("--batch-multiplier", type=int, default=4, help="the large batch, in small batches")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--rows", nargs="+", default=["*"], help="family/setting/variant patterns")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run before it is killed")
    parser.add_argument("--summarize-only", action="store_true", help="run nothing; summarize finished runs")
    parser.add_argument("--results", type=pathlib.Path, default=RESULTS, help="one folder per setting under it")
    args = parser.parse_args(argv)
    if args.setting:
        args.dataset, args.model = args.setting.split("-", 1)
    if args.model.startswith("transformer-"):
        parser.error(f"--setting {args.setting} names a results folder: pass --setting stdlib-transformer with "
                     f"--optimizer and --precision")
    args.program = TRANSFORMER if args.model == "transformer" else CLASSIFIER
    if args.program is TRANSFORMER and args.dataset != "stdlib":
        parser.error("the transformer trains on the standard library's sources: --setting stdlib-transformer")
    args.setting = f"{args.dataset}-{args.model}"  # the results folder
    if args.program is TRANSFORMER:
        args.setting += f"-{args.optimizer}-{args.precision}"
    return args


def main(argv=None):
    args = parse_args(argv)
    rows = [row for row in rows_of(args)
            if any(fnmatch.fnmatch(row_name(row), pattern) for pattern in args.rows)]
    command = shlex.join(["python", "benchmarks/study.py", *(sys.argv[1:] if argv is None else argv)])
    check_runs_match(args, rows_of(args))
    failures = [] if args.summarize_only else run_study(args, rows)
    summary = summarize(args, rows_of(args), command)
    print(f"{len(summary['rows'])} rows in {args.results / args.setting / 'summary.md'}")
    for failure in failures:
        print(f"run failed, see {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    started = time.time()
    code = main()
    print(f"study took {time.time() - started:.0f} s")
    sys.exit(code)
