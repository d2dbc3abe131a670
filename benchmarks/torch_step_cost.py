"""Bytes per step and step time of an MLP, per compression, on real ranks.

    horovodrun -np 2 --gloo python benchmarks/torch_step_cost.py --out benchmarks/results/torch_step_cost.json

The default model is the demo's (64-128-64-10); ``--width`` and ``--depth`` make a wider
one. Every variant runs interleaved in the same job (rounds of each), so the time
ratios come from one run on the same, shared machine. ``--link`` only labels the
result: ``benchmarks/slow_link.sh`` runs this inside a rate-limited network namespace.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import horovod.torch as horovod

import horovod_accordion.torch as hvd


def mlp(width, depth):
    torch.manual_seed(0)
    if width is None:  # the demo model
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    layers = [torch.nn.Linear(64, width), torch.nn.ReLU()]
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


VARIANTS = {
    "horovod DistributedOptimizer": None,
    "ours, none": hvd.Compression.none,
    "ours, fp16": hvd.Compression.fp16,
    "ours, PowerSGD rank 1": hvd.Compression.powersgd(1),
    "ours, PowerSGD rank 2": hvd.Compression.powersgd(2),
    "ours, TopK 10%": hvd.Compression.topk(0.1),
    "ours, Accordion PowerSGD 2/1 (at ℓ_low)": hvd.Compression.powersgd(2, 1),
}


def build(compression, width, depth):
    model = mlp(width, depth)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    if compression is None:
        return model, horovod.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    return model, hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), compression=compression)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--width", type=int, help="hidden width; default: the demo model")
    parser.add_argument("--depth", type=int, default=2, help="hidden width x width layers")
    parser.add_argument("--link", default="local loopback, no rate limit")
    parser.add_argument("--out")
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    built = {name: build(compression, args.width, args.depth) for name, compression in VARIANTS.items()}
    x = torch.randn(args.batch_size, 64)
    y = torch.randint(0, 10, (args.batch_size,))
    times = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, (model, optimizer) in built.items():
            horovod.allreduce(torch.zeros(1), name="barrier")
            for step in range(args.steps + 1):
                if step == 1:
                    started = time.perf_counter()  # the first step of a round warms up
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
            times[name].append((time.perf_counter() - started) / args.steps)
    controller = os.environ.get("HOROVOD_CONTROLLER", "?")
    results = {"command": " ".join(["horovodrun -np", str(hvd.size()), f"--{controller}", "python"] + sys.argv),
               "machine": f"{platform.machine()}, torch {torch.__version__}, 1 thread per rank",
               "link": args.link,
               "parameters": sum(p.numel() for p in mlp(args.width, args.depth).parameters()),
               "variants": {}}
    baseline = statistics.median(times["horovod DistributedOptimizer"])
    for name, (_, optimizer) in built.items():
        median = statistics.median(times[name])
        entry = {"median_step_ms": round(median * 1e3, 3), "ratio_to_horovod": round(median / baseline, 3)}
        if hasattr(optimizer, "accordion_stats"):
            entry["bytes_per_step"] = optimizer.accordion_stats()["bytes_per_step"][-1]
        results["variants"][name] = entry
    if hvd.rank() == 0:
        print(json.dumps(results, indent=2))
        if args.out:
            with open(args.out, "w") as stream:
                json.dump(results, stream, indent=2)


if __name__ == "__main__":
    main()
