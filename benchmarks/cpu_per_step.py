"""CPU time against wall time per step, on each rank, split between the training thread and
the rest (Horovod's background thread, Gloo's and torch.distributed's threads): how much of a
2-rank CPU job's step the communication takes from the cores the compute runs on, which the
advisor's profile (one process, collectives that return at once) cannot see.

    PYTHONPATH=. OMP_NUM_THREADS=1 horovodrun -np 2 --gloo python benchmarks/cpu_per_step.py \
        --out benchmarks/results/cpu_per_step.json   # unlimited loopback, about 5 minutes on 2 cores

``--link 100mbit --variants ...`` inside a link's network namespace (as ``speed.sh`` makes it)
times a subset on that link; ``benchmarks/slow_link_cpu.sh`` runs the 100 Mbit/s one.

Variants run interleaved in rounds, as in speed.py, so a drift of this shared machine's speed
falls on all of them. "spinning wait" variants wait for our collectives in Horovod's own
``synchronize()``, as before 6461947, to compare the two waits in one job. Per-thread CPU time
is read from /proc (Linux), in clock ticks (10 ms), over 5 steps at a time.
"""
import argparse
import contextlib
import json
import os
import statistics
import threading
import time

import torch
import torch.distributed as dist
import horovod.torch as horovod

import horovod_accordion.torch as hvd
from horovod_accordion.torch import ops
from benchmarks.speed import BATCH, VARIANTS, Variant, random_batch, start_job

NAMES = ["compute only", "stock horovod", "ours none", "ours powersgd r1", "ours powersgd r1, spinning wait",
         "ours topk 0.01", "ours topk 0.01, spinning wait", "ddp allreduce", "ddp powersgd r1", "ddp accordion hook r1"]
SPINNING = ", spinning wait"
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds_per_thread():
    """{thread id: user + system CPU seconds} for every thread of this process."""
    seconds = {}
    for thread in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{thread}/stat") as stream:
                fields = stream.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended between the listing and the read
            continue
        seconds[int(thread)] = (int(fields[11]) + int(fields[12])) / TICKS_PER_S
    return seconds


@contextlib.contextmanager
def waits_of(name):
    """Our collectives' waits as ``name`` asks: polling (ours), or Horovod's spinning ``synchronize()``."""
    polling = ops._wait_for
    if name.endswith(SPINNING):
        ops._wait_for = lambda handle, polling: ops.hvd.synchronize(handle)
    try:
        yield
    finally:
        ops._wait_for = polling


def timed_steps(variant, steps, generator):
    """Wall, training-thread CPU and other threads' CPU seconds, per step, over ``steps`` steps."""
    main = threading.get_native_id()
    before, started = cpu_seconds_per_thread(), time.perf_counter()
    for _ in range(steps):
        variant.step(*random_batch(generator))
    wall = time.perf_counter() - started
    used = {thread: seconds - before.get(thread, 0.0) for thread, seconds in cpu_seconds_per_thread().items()}
    training = used.pop(main)
    return wall / steps, training / steps, sum(used.values()) / steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--link", default="unlimited loopback", help="the link it runs on, for the record")
    parser.add_argument("--variants", default=",".join(NAMES), help="comma-separated; speed.py's names, or with "
                                                                   f"{SPINNING!r} after ours")
    parser.add_argument("--out")
    args = parser.parse_args()
    generator = start_job(master_port=29535)
    names = args.variants.split(",")
    variants = {name: Variant(name.removesuffix(SPINNING), *VARIANTS[name.removesuffix(SPINNING)]) for name in names}
    rounds = {name: [] for name in names}
    for _ in range(args.rounds):
        for name, variant in variants.items():
            horovod.allreduce(torch.zeros(1), name=f"cpu_per_step.barrier.{name}")
            with waits_of(name):
                timed_steps(variant, args.warmup, generator)
                rounds[name].append(timed_steps(variant, args.steps, generator))
    results = {}
    for name, measured in rounds.items():
        mine = torch.tensor([statistics.median(column) for column in zip(*measured)], dtype=torch.float64)
        ranks = horovod.allgather(mine.unsqueeze(0), name=f"cpu_per_step.{name}")
        results[name] = {key: [round(float(t), 3) for t in ranks[:, column]] for column, key in
                         enumerate(("wall_s", "training_thread_cpu_s", "other_threads_cpu_s"))}
        if hvd.rank() == 0:
            print(name, results[name], flush=True)
    if hvd.rank() == 0 and args.out:
        record = {"command": os.environ.get("CPU_PER_STEP_COMMAND", "PYTHONPATH=. OMP_NUM_THREADS=1 horovodrun -np 2 "
                                            "--gloo python benchmarks/cpu_per_step.py --out " + args.out),
                  "ranks": hvd.size(), "batch_per_rank": BATCH, "link": args.link,
                  "timing": f"per rank (one value per rank in each list), the median over {args.rounds} rounds "
                            f"of {args.steps} steps each after {args.warmup} warm-up steps, variants interleaved",
                  "variants": results}
        with open(args.out, "w") as stream:
            json.dump(record, stream, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
