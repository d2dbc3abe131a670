"""Plots of Accordion runs, from their JSONL logs (matplotlib, PNG).

    python -m horovod_accordion.tools.plot LOG.jsonl -o DIR [--layer NAME]

``LOG.jsonl`` is either a training record (``examples/pytorch_train.py --record``: one line per
epoch, plus the checks and decays) or an optimizer's own ``log_path`` (steps, checks and
decays). For one run it draws:

- ``norm.png``: one layer's accumulated-gradient norm at each check, the critical regimes
  (ℓ_low) shaded and the learning rate on a second axis, as in the paper's Figure 2a;
- ``levels.png``: a heat map of each layer's level over time;
- ``accuracy.png`` (or ``validation_loss.png``, the transformer's): the score per epoch
  (training records only).

The study (``benchmarks/study.py``) adds, per setting, the score of every setting of a
family over epochs with a ±1 std band over seeds, and the score against bytes sent; where
the runs record their layers' types (the transformer), each family's loss curves with the
level each adaptive policy chose per layer type under them.
"""

import argparse
import json
import pathlib
import typing

__all__ = ["read_log", "run_figures", "study_figures", "layer_type_figures"]

class Metric(typing.NamedTuple):
    """A training record's score per epoch, as the plots and the study's tables show it."""
    stem: str  # of the figures' file names
    label: str
    higher_is_better: bool
    decimals: int  # in the study's tables


METRICS = {"test_accuracy": Metric("accuracy", "test accuracy (%)", True, 1),
           "validation_loss": Metric("validation_loss", "validation loss (nats per byte)", False, 4)}


def read_log(path):
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _time_axis(records):
    """Epochs where the log has them (training records), optimizer steps otherwise."""
    if any(r["event"] == "epoch" for r in records):
        return "epoch", lambda r: r["epoch"]
    return "step", lambda r: r["step"]


def learning_rates(records, when):
    """``[(time, lr)]``: the epochs' rates, or without epoch records (an optimizer's or DDP
    state's own log), the rates its checks and decay events saw."""
    epochs = [r for r in records if r["event"] == "epoch"]
    events = epochs or [r for r in records if r["event"] in ("check", "lr_decay") and r.get("lr") is not None]
    # A decay is logged at the step of the check before it: sort by time alone, keeping the log's order.
    return sorted(((when(r), r["lr"]) for r in events), key=lambda point: point[0])


def _varying_layer(checks):
    """A compressed layer whose level changes, else the first compressed one, else (no layer
    has a level) the first layer."""
    names = list(checks[0]["levels"])
    for name in names:
        if len({c["levels"][name] for c in checks}) > 1:
            return name
    return names[0] if names else next(iter(checks[0]["norms"]))


def run_figures(log_path, out_dir, layer=None, prefix=""):
    """The PNGs of one run; returns their paths."""
    plt = _pyplot()
    records = read_log(log_path)
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    axis, when = _time_axis(records)
    checks = [r for r in records if r["event"] == "check"]
    epochs = [r for r in records if r["event"] == "epoch"]
    written = []
    if checks and not checks[0]["norms"] and layer is not None:
        raise ValueError(f"{log_path} logs no norms (its policy reads none): --layer has nothing to draw")
    if checks and checks[0]["norms"]:
        layer = layer or _varying_layer(checks)
        if layer not in checks[0]["norms"]:
            raise ValueError(f"no layer {layer!r} in {log_path}; layers: {sorted(checks[0]['norms'])}")
        # Only a compressed layer has levels to shade: a 1-D one's norm is drawn alone.
        leveled = layer in checks[0]["levels"]
        low = max(level for c in checks for level in c["levels"].values()) if leveled else None
        figure, ax = plt.subplots(figsize=(7, 4))
        ax.plot([when(c) for c in checks], [c["norms"][layer] for c in checks], "o-", label="‖Δ‖ at each check")
        # Training starts critical. A check closes its epoch and rules from the next one; a
        # decay event rules from its own epoch (or step).
        start_of = {("epoch", "check"): 1}
        events = sorted([(0, leveled)] + [(when(r) + start_of.get((axis, r["event"]), 0),
                                           leveled and r["levels"][layer] == low)
                                          for r in records if r["event"] in ("check", "lr_decay")])
        end = max([when(r) for r in records if axis in r] + [events[-1][0]]) + 1
        for (start, critical), (stop, _) in zip(events, events[1:] + [(end, None)]):
            if critical:
                ax.axvspan(start, stop, color="tab:orange", alpha=0.2, lw=0)
        ax.set_xlabel(axis)
        ax.set_ylabel(f"accumulated-gradient norm, {layer}")
        ax.set_title("critical regimes (shaded: ℓ_low)")
        lrs = learning_rates(records, when)
        if len(lrs) > 1:
            twin = ax.twinx()
            twin.step(*zip(*lrs), where="post", color="tab:green", label="learning rate")
            twin.set_ylabel("learning rate")
            twin.set_yscale("log")
        written.append(_save(figure, out_dir / f"{prefix}norm.png"))

    # Logs of 0.2.0 list None levels for the layers that none and fp16 leave whole.
    timeline = epochs if epochs and epochs[0].get("levels") and None not in epochs[0]["levels"].values() else checks
    if timeline and timeline[0]["levels"]:
        names = list(timeline[0]["levels"])
        grid = [[r["levels"][name] for r in timeline] for name in names]
        figure, ax = plt.subplots(figsize=(7, 0.5 + 0.35 * len(names)))
        image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis",
                          extent=(when(timeline[0]) - 0.5, when(timeline[-1]) + 0.5, len(names) - 0.5, -0.5))
        ax.set_yticks(range(len(names)), names)
        ax.set_xlabel(axis)
        figure.colorbar(image, ax=ax, label="level")
        ax.set_title("level per layer")
        written.append(_save(figure, out_dir / f"{prefix}levels.png"))

    metric = _metric_of(epochs[0]) if epochs else None
    if metric:
        stem, label = METRICS[metric].stem, METRICS[metric].label
        figure, ax = plt.subplots(figsize=(7, 4))
        ax.plot([r["epoch"] for r in epochs], [r[metric] for r in epochs])
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        written.append(_save(figure, out_dir / f"{prefix}{stem}.png"))
    return written


def _metric_of(record):
    """The score a record holds; ``None`` for a log that holds none we know."""
    return next((metric for metric in METRICS if metric in record), None)


_POLICY_COLORS = {"accordion": "tab:red", "error_budget": "tab:green", "phase": "tab:purple"}
# Every setting of a family in its own colour, the same in every figure.
_SETTING_COLORS = dict(_POLICY_COLORS, uncompressed="tab:gray", fp16="tab:olive", low="tab:blue",
                       high="tab:orange", small="tab:gray", large="tab:orange")


def study_figures(summary, curves, out_dir):
    """The score over epochs per family (mean ± 1 std over seeds, main rows) and the score
    against bytes sent (every row). ``curves``: {"family/setting/variant": [per-seed scores]}."""
    import numpy as np

    plt = _pyplot()
    metric = summary.get("metric", "test_accuracy")
    stem, label, higher_is_better, _ = METRICS[metric]
    out_dir = pathlib.Path(out_dir)
    written = []
    for family in dict.fromkeys(r["family"] for r in summary["rows"]):
        figure, ax = plt.subplots(figsize=(7, 4))
        for row in summary["rows"]:
            key = f"{family}/{row['setting']}/default"
            if row["family"] != family or row["variant"] != "default" or key not in curves:
                continue
            runs = np.array(curves[key])
            mean, std = runs.mean(axis=0), runs.std(axis=0, ddof=1) if len(runs) > 1 else np.zeros(runs.shape[1])
            color = _SETTING_COLORS.get(row["setting"])
            ax.plot(mean, label=f"{row['setting']} ({len(runs)} seeds)", color=color)
            ax.fill_between(range(len(mean)), mean - std, mean + std, alpha=0.2, color=color)
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        if higher_is_better:
            ax.set_ylim(bottom=max(0, ax.get_ylim()[0]))
        ax.set_title(f"{family}: {summary['dataset']} / {summary['model']}, mean ± 1 std")
        ax.legend()
        written.append(_save(figure, out_dir / f"{stem}_{family}.png"))

    from matplotlib.ticker import FuncFormatter

    figure, ax = plt.subplots(figsize=(7, 5))
    markers = {"powersgd": "o", "topk": "s", "batch": "^", "quantized": "D"}
    drawn = set()
    for row in summary["rows"]:
        if row.get("wire_bytes_per_rank_mean") is None:  # a TopK run recorded before wire bytes were
            continue
        point = (row["wire_bytes_per_rank_mean"], row[f"{metric}_mean"], row[f"{metric}_std"])
        if point in drawn:  # a run shared by several families (uncompressed): one point, one label
            continue
        drawn.add(point)
        ax.errorbar(point[0] / 1e6, point[1], yerr=point[2],
                    fmt=markers.get(row["family"], "o"), capsize=3,
                    color=_POLICY_COLORS.get(row["setting"], "tab:blue"))
        name = row["setting"] if row["variant"] == "default" else row["variant"]
        shared = row["setting"] in ("uncompressed", "fp16", "small")
        ax.annotate(name if shared else f"{row['family']} {name}", (point[0] / 1e6, point[1]),
                    fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    for axis in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
        axis(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.set_xlabel("MB across each rank's link (log)")
    ax.set_ylabel(f"final {label}, ± 1 std")
    ax.set_title(f"{stem.replace('_', ' ')} against traffic (red: Accordion)")
    written.append(_save(figure, out_dir / f"{stem}_vs_bytes.png"))
    return written


def layer_type_figures(summary, curves, out_dir):
    """Per family: the main rows' mean score over epochs, less uncompressed's (the distance
    users ask about), and under it one panel per adaptive row with the mean level it chose
    for each layer type (``mean_level_by_layer_type``)."""
    import numpy as np

    plt = _pyplot()
    metric = summary.get("metric", "test_accuracy")
    stem, label = METRICS[metric].stem, METRICS[metric].label
    written = []
    for family in dict.fromkeys(r["family"] for r in summary["rows"]):
        rows = [r for r in summary["rows"] if r["family"] == family and r["variant"] == "default"]
        adaptive = [r for r in rows if "mean_level_by_layer_type" in r]
        if not adaptive:
            continue
        figure, axes = plt.subplots(1 + len(adaptive), 1, sharex=True, figsize=(7, 3 + 1.6 * len(adaptive)),
                                    gridspec_kw={"height_ratios": [2] + [1] * len(adaptive)})
        mean_of = {row["setting"]: np.array(curves[f"{family}/{row['setting']}/default"]).mean(axis=0)
                   for row in rows}
        reference = mean_of.get("uncompressed", 0)
        for row in rows:
            axes[0].plot(mean_of[row["setting"]] - reference, label=row["setting"],
                         color=_SETTING_COLORS.get(row["setting"]))
        axes[0].set_ylabel(f"{label}\n− uncompressed" if "uncompressed" in mean_of else label)
        axes[0].legend(fontsize=7, ncol=2)
        axes[0].set_title(f"{family}: {summary['dataset']} / {summary['model']}, mean over seeds; levels below")
        for ax, row in zip(axes[1:], adaptive):
            for kind, levels in row["mean_level_by_layer_type"].items():
                ax.step(range(len(levels)), levels, where="mid", label=kind)
            ax.set_ylabel(f"{row['setting']}\nlevel")
            ax.legend(fontsize=6, loc="upper right", ncol=4)
        axes[-1].set_xlabel("epoch")
        written.append(_save(figure, out_dir / f"{stem}_and_levels_{family}.png"))
    return written


def _save(figure, path):
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    figure.clf()
    import matplotlib.pyplot as plt
    plt.close(figure)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", help="a run's JSONL log")
    parser.add_argument("-o", "--out", required=True, help="folder for the PNGs")
    parser.add_argument("--layer", help="the layer of norm.png (default: the first whose level changes)")
    args = parser.parse_args(argv)
    for path in run_figures(args.log, args.out, layer=args.layer):
        print(path)


if __name__ == "__main__":
    main()
