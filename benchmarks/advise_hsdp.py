"""The advisor's hybrid-sharding prediction (``--layout hsdp``) against ``benchmarks/hsdp_link.sh``'s
measurement: ResNet-18, 2 replicas × 2 shards, the replicas joined by a veth pair, unlimited and at
100 Mbit/s (``tbf``), each node's shards by its loopback.

    python -m horovod_accordion.advise --model resnet18-cifar --threads 1 --layout hsdp --shards 2 \\
        --compressions none,fp16,powersgd:4,powersgd:1,topk:0.1 --workers 2 --link 100mbit \\
        --fast-link 10gbit --latency-us 67 \\
        --save-profile benchmarks/results/profiles/resnet18-cifar_cpu_1thread_hsdp2.json
    python benchmarks/advise_hsdp.py      # a second: no network, no profiling
      -> benchmarks/results/advise_hsdp.json

Two comparisons per variant. The step itself: the profile was taken by one process alone, where the
measured job runs 4 processes on 2 cores, so its compute is about twice the profile's; the advisor
has no model of that. The slow link's share, which that leaves out: the step at 100 Mbit/s less the
step on the unlimited veth, measured and predicted. Both replica groups cross the one veth pair
(``shared_by=2``, the CLI's default with ``--shards 2``); the unlimited veth and each node's loopback
are modelled as 10 Gbit/s, with the loopback's Gloo latency of ``advise_validation.py`` (67 µs a hop).
"""
import argparse
import json
import pathlib

from horovod_accordion.advise.hsdp import predict_hsdp
from horovod_accordion.advise.wire import parse_link

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
PROFILE = RESULTS / "profiles" / "resnet18-cifar_cpu_1thread_hsdp2.json"
MEASURED = RESULTS / "hsdp_resnet18.json"
LATENCY_S = 134e-6 / 2
# hsdp_speed.py's variant -> the advisor's compression (native HSDP's all-reduce is modelled as ours none).
VARIANTS = {"native hsdp": "none", "none": "none", "fp16": "fp16", "powersgd:4": "powersgd:4",
            "powersgd:1": "powersgd:1", "topk:0.1": "topk:0.1"}


def main(out=RESULTS / "advise_hsdp.json"):
    profile = json.loads(PROFILE.read_text())
    measured = json.loads(MEASURED.read_text())["links"]
    fast = parse_link("10gbit", LATENCY_S)
    links = {"none": parse_link("10gbit", LATENCY_S, shared_by=2), "100mbit": parse_link("100mbit", LATENCY_S, shared_by=2)}
    rows = {}
    for name, compression in VARIANTS.items():
        predicted = {link: predict_hsdp(profile, compression, 2, 2, fast, slow)["median"] for link, slow in links.items()}
        step = {link: measured[link][name]["median_step_s"] for link in links}
        rows[name] = {
            "measured_s": step, "predicted_s": {link: round(s, 4) for link, s in predicted.items()},
            "predicted_over_measured": {link: round(predicted[link] / step[link], 3) for link in links},
            "slow_link_share_measured_s": round(step["100mbit"] - step["none"], 4),
            "slow_link_share_predicted_s": round(predicted["100mbit"] - predicted["none"], 4),
        }
    record = {"command": "python benchmarks/advise_hsdp.py", "profile": str(PROFILE.relative_to(RESULTS.parent.parent)),
              "measured": str(MEASURED.relative_to(RESULTS.parent.parent)), "rows": rows}
    pathlib.Path(out).write_text(json.dumps(record, indent=1) + "\n")
    for name, row in rows.items():
        print(f"{name:12s} step at 100mbit: predicted {row['predicted_s']['100mbit']:.2f} s, measured "
              f"{row['measured_s']['100mbit']:.2f} s; slow link's share: predicted "
              f"{row['slow_link_share_predicted_s']:.2f} s, measured {row['slow_link_share_measured_s']:.2f} s")
    return record


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=RESULTS / "advise_hsdp.json")
    main(parser.parse_args().out)
