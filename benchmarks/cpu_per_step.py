"""CPU time against wall time per step, on each rank: how much of a 2-rank CPU job's step the
communication takes from the cores the compute runs on, which the advisor's profile (one
process, collectives that return at once) cannot see.

    horovodrun -np 2 --gloo python benchmarks/cpu_per_step.py --out benchmarks/results/cpu_per_step.json
    # unlimited loopback, 1 thread per rank (OMP_NUM_THREADS=1), about 2 minutes on 2 cores

A variant whose rank uses as much CPU time as wall time is CPU-bound: its collectives' work
(reductions, copies, the TCP stack, Horovod's coordination) ran on the compute's cores.
"""
import argparse
import json
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist
import horovod.torch as horovod

import horovod_accordion.torch as hvd
from benchmarks.speed import BATCH, VARIANTS, Variant

NAMES = ["compute only", "stock horovod", "ours none", "ours powersgd r1", "ours topk 0.01", "ddp allreduce",
         "ddp powersgd r1", "ddp accordion hook r1"]


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out")
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29535")
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())
    generator = torch.Generator().manual_seed(hvd.rank())
    results = {}
    for name in NAMES:
        variant = Variant(name, *VARIANTS[name])
        horovod.allreduce(torch.zeros(1), name=f"cpu_per_step.barrier.{name}")
        wall, cpu = [], []
        for step in range(args.warmup + args.steps):
            x = torch.randn(BATCH, 3, 32, 32, generator=generator)
            y = torch.randint(0, 10, (BATCH,), generator=generator)
            cpu_started, started = cpu_seconds(), time.perf_counter()
            variant.step(x, y)
            if step >= args.warmup:
                wall.append(time.perf_counter() - started)
                cpu.append(cpu_seconds() - cpu_started)
        mine = torch.tensor([statistics.median(wall), statistics.median(cpu)], dtype=torch.float64)
        ranks = horovod.allgather(mine.unsqueeze(0), name=f"cpu_per_step.{name}")
        results[name] = {"wall_s_per_rank": [round(float(t), 3) for t in ranks[:, 0]],
                         "cpu_s_per_rank": [round(float(t), 3) for t in ranks[:, 1]]}
        if hvd.rank() == 0:
            print(f"{name}: wall {results[name]['wall_s_per_rank']} cpu {results[name]['cpu_s_per_rank']}", flush=True)
    if hvd.rank() == 0 and args.out:
        record = {"command": "horovodrun -np 2 --gloo python benchmarks/cpu_per_step.py --out " + args.out,
                  "ranks": hvd.size(), "batch_per_rank": BATCH, "link": "unlimited loopback",
                  "timing": f"median of {args.steps} steps after {args.warmup} warm-up steps, per rank",
                  "variants": results}
        with open(args.out, "w") as stream:
            json.dump(record, stream, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
