"""Accordion's accuracy-versus-traffic study: real ``horovodrun`` jobs, one per setting × seed.

    python benchmarks/study.py --dataset mnist1d --model cnn1d --seeds 0 1 2 3 4
    python benchmarks/study.py --dataset cifar10 --data-dir /data --model cnn2d --seeds 0 1 2

Each run is ``examples/pytorch_train.py`` on ``--workers`` Gloo ranks; its per-epoch JSONL
record goes to ``benchmarks/results/study/SETTING/runs/ROW/seedK.jsonl``. A run whose
record ends with its ``done`` line is not run again, so a study can be spread over several
invocations (and stopped at any time). After the runs, the study writes ``summary.json``,
``summary.md`` and the PNGs into the setting's folder, from every finished run.

``--rows`` picks rows by name (``family/setting/variant``, shell patterns allowed); the
default is the main rows of every family, then the detector's levers.
"""
import argparse
import fnmatch
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time

from tqdm import tqdm

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "study"
TRAIN = REPO / "examples" / "pytorch_train.py"

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
    config = {"powersgd": args.powersgd_levels, "topk": args.topk_levels, "batch": (1, args.batch_multiplier)}
    ladders = {"powersgd": args.powersgd_ladder, "topk": args.topk_ladder}
    uncompressed = ("uncompressed", ["--compression", "none"])
    fp16 = ("fp16", ["--compression", "fp16"])
    rows = []
    for family in ("powersgd", "topk"):
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
    # Horovod's 1 ms default cycle time dominates a step of these small models: 0.2 ms takes
    # a 40-epoch MNIST-1D run on 4 ranks from 70 s to 45 s here.
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


def run_study(args, rows):
    folder = args.results / args.setting
    horovodrun = str(pathlib.Path(sys.executable).parent / "horovodrun")
    todo = []
    for seed in args.seeds:  # seed-major, so a study stopped early has every row at the same seeds
        for row in rows:
            path = folder / "runs" / row[4] / f"seed{seed}.jsonl"
            if path not in [p for p, _ in todo] and not finished(path):
                command = [horovodrun, "-np", str(args.workers), "--gloo", sys.executable, str(TRAIN),
                           "--dataset", args.dataset, "--model", args.model, "--epochs", str(args.epochs),
                           *(["--data-dir", args.data_dir] if args.data_dir else []),
                           "--seed", str(seed), "--no-progress", *row[5]]
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
    from horovod_accordion import plot

    folder = args.results / args.setting
    folder.mkdir(parents=True, exist_ok=True)
    history = folder / "commands.txt"
    commands = history.read_text().splitlines() if history.exists() else []
    if command not in commands and not args.summarize_only:
        commands.append(command)
        history.write_text("\n".join(commands) + "\n")
    summary_rows, curves = [], {}
    for row in rows:
        family, setting, variant, levels, run, _ = row
        runs = {}
        for path in sorted((folder / "runs" / run).glob("seed*.jsonl")):
            records = finished(path)
            if records:
                runs[int(path.stem[4:])] = records
        if not runs:
            continue
        done = [records[-1] for records in runs.values()]
        accuracy = [r["test_accuracy"] for r in done]
        summary_rows.append({
            "family": family, "setting": setting, "variant": variant, "levels": levels,
            "seeds": sorted(runs), "test_accuracy_mean": round(_mean(accuracy), 2),
            "test_accuracy_std": round(_std(accuracy), 2),
            "bytes_per_rank_mean": _mean([r["bytes_sent_per_rank"] for r in done]),
            "wall_time_s_mean": round(_mean([r["wall_time_s"] for r in done]), 1)})
        curves[row_name(row)] = [[e["test_accuracy"] for e in records if e["event"] == "epoch"]
                                 for records in runs.values()]
    reference = {r["family"]: r["bytes_per_rank_mean"] for r in summary_rows
                 if r["setting"] in ("low", "small") and r["variant"] == "default"}
    for r in summary_rows:
        r["bytes_vs_low"] = round(r["bytes_per_rank_mean"] / reference[r["family"]], 3) \
            if r["family"] in reference else None
    summary = {"command": " && ".join(commands), "dataset": args.dataset, "model": args.model,
               "workers": args.workers, "epochs": args.epochs, "rows": summary_rows}
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    pngs = plot.study_figures(summary, curves, folder)
    example = folder / "runs" / "powersgd-accordion" / f"seed{args.seeds[0]}.jsonl"
    if finished(example):
        pngs += plot.run_figures(example, folder, prefix="powersgd-accordion-")
    (folder / "summary.md").write_text(summary_markdown(summary, pngs))
    return summary


def summary_markdown(summary, pngs):
    lines = [f"# {summary['dataset']} / {summary['model']}: {summary['workers']} workers, {summary['epochs']} epochs",
             "", f"Command: `{summary['command']}`", "",
             "Final test accuracy, mean ± std over the seeds; bytes each rank sent over the whole run "
             "(gradients and Accordion's norm reductions); the ratio to static ℓ_low (small batch for the "
             "batch family); the training time per run.", "",
             "| family | setting | variant | levels | seeds | test accuracy (%) | MB sent per rank | bytes vs ℓ_low "
             "| train time (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        levels = "–" if r["levels"][0] is None else "/".join(f"{level:g}" for level in r["levels"])
        ratio = "–" if r["bytes_vs_low"] is None else f"{r['bytes_vs_low']:.2f}×"
        lines.append(f"| {r['family']} | {r['setting']} | {r['variant']} | {levels} | {len(r['seeds'])} | "
                     f"{r['test_accuracy_mean']:.1f} ± {r['test_accuracy_std']:.1f} | "
                     f"{r['bytes_per_rank_mean'] / 1e6:.2f} | {ratio} | {r['wall_time_s_mean']:.0f} |")
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
    parser.add_argument("--setting", help="shorthand for DATASET-MODEL, e.g. mnist1d-cnn1d-wide")
    parser.add_argument("--powersgd-levels", type=int, nargs=2, default=(4, 1), metavar=("LOW", "HIGH"))
    parser.add_argument("--topk-levels", type=float, nargs=2, default=(0.5, 0.1), metavar=("LOW", "HIGH"))
    parser.add_argument("--powersgd-ladder", type=int, nargs="+", default=(4, 2, 1), help="for the policies' rows")
    parser.add_argument("--topk-ladder", type=float, nargs="+", default=(0.5, 0.25, 0.1), help="for the policies' rows")
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
    args.setting = f"{args.dataset}-{args.model}"  # the results folder
    return args


def main(argv=None):
    args = parse_args(argv)
    rows = [row for row in rows_of(args)
            if any(fnmatch.fnmatch(row_name(row), pattern) for pattern in args.rows)]
    command = shlex.join(["python", "benchmarks/study.py", *(sys.argv[1:] if argv is None else argv)])
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
