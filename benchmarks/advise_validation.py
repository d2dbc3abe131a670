"""The advisor against this machine's measurements: predict, from a profile taken with no
network, what ``benchmarks/speed.sh`` measured for every variant at 100 Mbit/s and 1 Gbit/s,
and write each prediction beside its measurement.

    python -m horovod_accordion.advise --model resnet18-cifar --threads 1 \\
        --compressions none,fp16,powersgd:1,powersgd:2,powersgd:4,topk:0.01,topk:0.1,\\
accordion:powersgd:2/1,accordion:powersgd:4/1,accordion:topk:0.99/0.1 \\
        --workers 2,4,8,16,64,256 --link 1gbit \\
        --save-profile benchmarks/results/profiles/resnet18-cifar_cpu_1thread.json   # under flock, machine quiet
    python benchmarks/advise_validation.py      # a few seconds: no network, no profiling
      -> benchmarks/results/advise_validation.json and .png

The links are speed.sh's: both ranks share one tbf-limited loopback (``shared_by=2``), with
the loopback's Gloo latency measured here (a 4-byte allreduce of 2 ranks: 134 µs, 2 hops).
Two predictions per variant: from the profile as it is, and a calibration with every profiled
time scaled by the ratio of the variant's own forward pass (``median_forward_s``, timed by
speed.py in the same steps, before the gradient collectives) to the profile's. This machine is
shared, and its speed drifts within one speed.sh run (its "compute only" rounds); no profile
taken at another moment can see that. The calibration takes one measured number per row, so
its hits are a fit, not evidence for the model.
"""
import argparse
import copy
import json
import pathlib
import statistics

from horovod_accordion.advise.predict import predict
from horovod_accordion.advise.wire import parse_link

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
LATENCY_S = 134e-6 / 2
TARGETS = {"100mbit": 0.15, "1gbit": 0.25}
# speed.py's variant -> (the advisor's compression, layout, note). The Accordion variants check
# every step (window_steps=1, interval=1) and ended at ℓ_high: fraction of steps at ℓ_low 0.
VARIANTS = {
    "stock horovod": ("none", "horovod", "stock hvd.DistributedOptimizer, modelled as ours none"),
    "ours none": ("none", "horovod", ""),
    "ours fp16": ("fp16", "horovod", ""),
    "ours powersgd r1": ("powersgd:1", "horovod", ""),
    "ours powersgd r2": ("powersgd:2", "horovod", ""),
    "ours powersgd r4": ("powersgd:4", "horovod", ""),
    "ours accordion powersgd 2/1": ("accordion:powersgd:2/1", "horovod", "fraction at ℓ_low 0"),
    "ours topk 0.01": ("topk:0.01", "horovod", ""),
    "ours topk 0.1": ("topk:0.1", "horovod", ""),
    "ours accordion topk 0.99/0.1": ("accordion:topk:0.99/0.1", "horovod", "fraction at ℓ_low 0"),
    "ddp allreduce": ("none", "ddp", ""),
    "ddp fp16_compress_hook": ("fp16", "ddp", ""),
    "ddp powersgd r1": ("powersgd:1", "ddp", "torch's powerSGD_hook in one bucket, modelled as our reducer in DDP's"),
    "ddp powersgd r2": ("powersgd:2", "ddp", "torch's powerSGD_hook in one bucket, modelled as our reducer in DDP's"),
    "ddp accordion hook r1": ("powersgd:1", "ddp", ""),
    "ddp accordion hook r2": ("powersgd:2", "ddp", ""),
    "ddp accordion hook 2/1": ("accordion:powersgd:2/1", "ddp", "fraction at ℓ_low 0"),
}


def scaled(profile, factor):
    """The profile with every measured time multiplied by ``factor``."""
    profile = copy.deepcopy(profile)
    compute = profile["compute"]
    for key in ("forward_s", "backward_s", "optimizer_s"):
        compute[key] = [t * factor for t in compute[key]]
    compute["layer_ready_s"] = [[t * factor for t in layer] for layer in compute["layer_ready_s"]]
    for layouts in profile["exchanges"].values():
        for sizes in layouts.values():
            for levels in sizes.values():
                for exchange in levels.values():
                    exchange["check_s"] = [t * factor for t in exchange["check_s"]]
                    for bucket in exchange["buckets"]:
                        for segment in bucket["segments"]:
                            segment["compute_s"] = [t * factor for t in segment["compute_s"]]
    return profile


def profiled_step(profile):
    compute = profile["compute"]
    return statistics.median(f + b + o for f, b, o in
                             zip(compute["forward_s"], compute["backward_s"], compute["optimizer_s"]))


def slowdown(profile, run):
    """How much slower ``run``'s forward passes were than the profile's. The forward pass comes
    before the step's gradient collectives, so this is mostly the shared machine's drift; under
    DDP it also holds the broadcast of BatchNorm's buffers, which waits for the other rank."""
    return run["median_forward_s"] / statistics.median(profile["compute"]["forward_s"])


def validate(profile, measured):
    rows = []
    for link_name, target in TARGETS.items():
        link = parse_link(link_name, LATENCY_S, shared_by=2)
        runs = measured["links"][link_name]
        for name, (variant, layout, note) in VARIANTS.items():
            run = runs[name]
            factor = slowdown(profile, run)
            raw = predict(profile, variant, layout, measured["ranks"], link, low_fraction=0.0)
            fitted = predict(scaled(profile, factor), variant, layout, measured["ranks"], link, low_fraction=0.0)
            error = raw["median"] / run["median_step_s"] - 1
            fitted_error = fitted["median"] / run["median_step_s"] - 1
            rows.append({
                "link": link_name, "variant": name, "advisor": {"compression": variant, "layout": layout},
                "note": note, "measured_s": run["median_step_s"], "measured_rounds_s": run["round_medians_s"],
                "predicted_s": {k: round(v, 4) for k, v in raw.items()}, "error": round(error, 3),
                "within_target": abs(error) <= target,
                "compute_scaled": {"factor": round(factor, 3),
                                   "predicted_s": {k: round(v, 4) for k, v in fitted.items()},
                                   "error": round(fitted_error, 3), "within_target": abs(fitted_error) <= target},
            })
        only = runs["compute only"]
        factor = slowdown(profile, only)
        rows.append({"link": link_name, "variant": "compute only", "measured_s": only["median_step_s"],
                     "measured_rounds_s": only["round_medians_s"], "predicted_s": round(profiled_step(profile), 4),
                     "compute_scaled": {"factor": round(factor, 3),
                                        "predicted_s": round(profiled_step(profile) * factor, 4)}})
    return rows


def summary(rows):
    out = {}
    for link, target in TARGETS.items():
        mine = [r for r in rows if r["link"] == link and "error" in r]
        for key, pick in (("profile", lambda r: r), ("compute_scaled", lambda r: r["compute_scaled"])):
            errors = [abs(pick(r)["error"]) for r in mine]
            out.setdefault(link, {})[key] = {
                "target": target, "within": sum(pick(r)["within_target"] for r in mine), "of": len(mine),
                "median_abs_error": round(statistics.median(errors), 3), "max_abs_error": round(max(errors), 3),
                "misses": {r["variant"]: pick(r)["error"] for r in mine if not pick(r)["within_target"]}}
    return out


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    figure, axes = plt.subplots(1, len(TARGETS), figsize=(13, 6.5), sharey=True)
    for axis, (link, target) in zip(axes, TARGETS.items()):
        mine = [r for r in rows if r["link"] == link and "error" in r]
        ys = range(len(mine))
        measured = [r["measured_s"] for r in mine]
        axis.errorbar(measured, ys, xerr=[[m - min(r["measured_rounds_s"]) for m, r in zip(measured, mine)],
                                          [max(r["measured_rounds_s"]) - m for m, r in zip(measured, mine)]],
                      fmt="ks", label="measured (median, round range)")
        for key, label, colour, shift in (
                ("profile", "predicted from the profile", "tab:blue", 0.2),
                ("compute_scaled", "predicted, compute scaled by the variant's own forward", "tab:orange", -0.2)):
            picked = [r if key == "profile" else r["compute_scaled"] for r in mine]
            median = [p["predicted_s"]["median"] for p in picked]
            axis.errorbar(median, [y + shift for y in ys],
                          xerr=[[m - p["predicted_s"]["fastest"] for m, p in zip(median, picked)],
                                [p["predicted_s"]["slowest"] - m for m, p in zip(median, picked)]],
                          fmt="o", color=colour, label=label)
        axis.set_xscale("log")
        axis.xaxis.set_major_formatter(FormatStrFormatter("%g"))
        axis.xaxis.set_minor_formatter(FormatStrFormatter("%g"))
        axis.tick_params(axis="x", which="minor", labelsize=7)
        axis.set_yticks(list(ys))
        axis.set_yticklabels([r["variant"] for r in mine], fontsize=8)
        axis.set_title(f"{link} (target ±{target:.0%})")
        axis.set_xlabel("seconds per step, ResNet-18, 2 ranks")
        axis.grid(axis="x", alpha=0.3)
    axes[0].invert_yaxis()
    axes[-1].legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default=str(RESULTS / "profiles" / "resnet18-cifar_cpu_1thread.json"))
    parser.add_argument("--measured", default=str(RESULTS / "speed_resnet18.json"))
    parser.add_argument("--out", default=str(RESULTS / "advise_validation.json"))
    args = parser.parse_args()
    profile = json.loads(pathlib.Path(args.profile).read_text())
    measured = json.loads(pathlib.Path(args.measured).read_text())
    rows = validate(profile, measured)
    result = {"command": "python benchmarks/advise_validation.py", "profile": args.profile,
              "measured": args.measured, "latency_per_hop_s": LATENCY_S, "links_shared_by": 2,
              "summary": summary(rows), "rows": rows}
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    plot(rows, pathlib.Path(args.out).with_suffix(".png"))
    print(json.dumps(result["summary"], indent=1, ensure_ascii=False))
    for r in rows:
        if "error" in r:
            scaled = r["compute_scaled"]
            print(f"{r['link']:>8} {r['variant']:<30} measured {r['measured_s']:6.3f}  predicted "
                  f"{r['predicted_s']['median']:6.3f} ({r['error']:+.0%})  scaled "
                  f"{scaled['predicted_s']['median']:6.3f} ({scaled['error']:+.0%})")


if __name__ == "__main__":
    main()
