"""The maths of one step of each reducer on ResNet-18's gradients (11.2 M values), on one CPU
thread (or a GPU), with the collectives taken away: the advisor's ``SimulatedWorld`` of W ranks
returns each collective's result at once, so what is timed is the reducer's own work. Quantized:
both quantizations, both dequantizations, the packing and both memories; PowerSGD: M Q, the
orthogonalisation, Mᵀ P, P Qᵀ and the memory. Eager; every row of one invocation is measured in
the same run, in turns.

    python benchmarks/quantized_maths.py --out benchmarks/results/quantized_maths.json
"""
import argparse
import json
import platform
import statistics
import time

import torch

from horovod_accordion.advise.models import resnet18_cifar
from horovod_accordion.advise.profile import SimulatedWorld
from horovod_accordion.core.compression import PowerSGD, Quantized
from horovod_accordion.core.reducers import PowerSGDReducer, QuantizedReducer

ROWS = {"quantized 8": Quantized(8), "quantized 4": Quantized(4), "quantized 2": Quantized(2),
        "powersgd 4": PowerSGD(4), "powersgd 1": PowerSGD(1)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    grads = [torch.randn(p.shape, device=device) for p in resnet18_cifar().parameters()]
    shapes = [g.shape for g in grads]
    reducers = {}
    for name, config in ROWS.items():
        world = SimulatedWorld(args.workers, device)
        reducer_class = QuantizedReducer if isinstance(config, Quantized) else PowerSGDReducer
        reducers[name] = reducer_class(shapes, config, world.tensors, world)
    times = {name: [] for name in reducers}
    for repeat in range(args.repeats + 2):  # two warm-ups (buffers)
        for name, reducer in reducers.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            reducer.reduce(grads)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if repeat >= 2:
                times[name].append(time.perf_counter() - started)
    result = {"command": "python benchmarks/quantized_maths.py " + " ".join(
                  f"--{k} {v}" for k, v in vars(args).items() if k != "out" and v is not None),
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
              "threads": torch.get_num_threads(), "values": sum(g.numel() for g in grads), "workers": args.workers,
              "median_ms": {name: round(1e3 * statistics.median(t), 1) for name, t in times.items()}}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as stream:
            json.dump(result, stream, indent=1)


if __name__ == "__main__":
    main()
