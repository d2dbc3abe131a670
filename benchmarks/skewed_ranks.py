"""An adaptive step against a static one on 2 ranks, one of them slowed by a known amount each
step (a sleep in its forward): what agreeing the learning rate costs where ranks are skewed,
which a one-process run (``overhead.py``) cannot see. Accordion PowerSGD 2/1, held at rank 1
between checks, against static PowerSGD rank 1, on the Horovod torch optimizer and on the DDP
hook, with the decay rule (the rate agreed every step, ``core.rates``) and without it (what is
left is the detector's own work: Δ and the finite counts).

    PYTHONPATH=. OMP_NUM_THREADS=1 horovodrun -np 2 --gloo python benchmarks/skewed_ranks.py \\
        --out benchmarks/results/skewed_ranks.json

Every variant is built once and timed in interleaved rounds; a figure is the median over every
timed step of every round, on rank 0 (the fast rank, which waits for the slow one).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist

import horovod_accordion.torch as hvd
from horovod_accordion.ddp import AccordionState, PowerSGD, accordion_hook

VARIANTS = ["horovod static r1", "horovod accordion 2/1", "horovod accordion 2/1 without the decay rule",
            "ddp static r1", "ddp accordion 2/1", "ddp accordion 2/1 without the decay rule"]


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10))


def held_at_rank_one(exchange):
    """Between checks an adaptive run sits at ℓ_high: put it there, with no check in the run."""
    schedule = exchange.accordion.state_dict()
    exchange.load_schedule(dict(schedule, current_levels=[1] * len(schedule["current_levels"])))


def build(variant):
    model = make_model()
    adaptive = "accordion" in variant
    # Without the rule, nothing is agreed: what is left is the detector's own work (Δ, finite counts).
    decay_factor = None if variant.endswith("without the decay rule") else 2.0
    if variant.startswith("horovod"):
        compression = hvd.Compression.powersgd(2, 1, min_compression_rate=0) if adaptive else \
            hvd.Compression.powersgd(1, min_compression_rate=0)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                             named_parameters=model.named_parameters(), compression=compression,
                                             window_steps=100_000, lr_decay_factor=decay_factor)
        if adaptive:
            held_at_rank_one(optimizer._exchange)
        return model, optimizer
    model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    compression = PowerSGD(2, 1, min_compression_rate=0) if adaptive else PowerSGD(1, min_compression_rate=0)
    state = AccordionState(compression=compression, model=model, optimizer=optimizer, window_steps=100_000,
                           lr_decay_factor=decay_factor)
    model.register_comm_hook(state, accordion_hook)
    if adaptive:
        held_at_rank_one(state._exchange)
    return model, optimizer


def step_times(model, optimizer, steps, slow_s, x, y):
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        optimizer.zero_grad()
        if hvd.rank() == 1:
            time.sleep(slow_s)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
    return times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--slow-ms", type=float, default=20.0)
    parser.add_argument("--out")
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29537")
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())
    generator = torch.Generator().manual_seed(hvd.rank())
    x, y = torch.randn(64, 256, generator=generator), torch.randint(0, 10, (64,), generator=generator)
    built = {variant: build(variant) for variant in VARIANTS}
    for model, optimizer in built.values():
        step_times(model, optimizer, 5, args.slow_ms / 1e3, x, y)  # warm-up
    samples = {variant: [] for variant in VARIANTS}
    for _ in range(args.rounds):
        for variant, (model, optimizer) in built.items():
            samples[variant] += step_times(model, optimizer, args.steps, args.slow_ms / 1e3, x, y)
    medians = {variant: statistics.median(times) for variant, times in samples.items()}
    ratios = {f"{backend}: accordion 2/1{rule} / static r1":
              medians[f"{backend} accordion 2/1{rule}"] / medians[f"{backend} static r1"]
              for backend in ("horovod", "ddp") for rule in ("", " without the decay rule")}
    if hvd.rank() == 0:
        results = {"median_step_ms": {v: round(m * 1e3, 3) for v, m in medians.items()},
                   "ratios": {k: round(v, 4) for k, v in ratios.items()}, "target": 1.02}
        print(json.dumps(results, indent=1), flush=True)
        if args.out:
            with open(args.out, "w") as stream:
                json.dump({"command": "PYTHONPATH=. OMP_NUM_THREADS=1 horovodrun -np 2 --gloo python "
                                      + " ".join(sys.argv),
                           "what": f"median step time on rank 0 (the fast rank) over {args.rounds} interleaved "
                                   f"rounds of {args.steps} steps; rank 1 sleeps {args.slow_ms} ms before each "
                                   f"forward; MLP 256-512-512-10, batch 64, 1 thread per rank, one machine",
                           "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                           "results": results}, stream, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
