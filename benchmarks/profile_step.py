"""Where a variant of ``speed.py`` spends its step: torch.profiler on rank 0, top entries by
self CPU time, written to ``benchmarks/results/profile_<variant>.txt``, or with
``PROFILE_PREFIX=overhead_`` (one process, for ``overhead.py``) ``overhead_profile_<variant>.txt``.

    horovodrun -np 2 --gloo python benchmarks/profile_step.py "ours topk 0.1" "ours powersgd r1"

Time spent waiting for a Horovod collective shows up as the self time of the call that
waits (``Optimizer.step`` for ours: ``synchronize()`` runs inside it).
"""
import os
import sys

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import horovod_accordion.torch as hvd
from benchmarks.speed import VARIANTS, Variant, random_batch, start_job

STEPS = 3


def main(names):
    generator = start_job(master_port=29534)
    for name in names:
        variant = Variant(name, *VARIANTS[name])
        for _ in range(3):
            variant.step(*random_batch(generator))
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(STEPS):
                variant.step(*random_batch(generator))
        if hvd.rank() == 0:
            table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
            prefix = os.environ.get("PROFILE_PREFIX", "")
            path = f"benchmarks/results/{prefix}profile_{name.replace(' ', '_').replace('/', '-')}.txt"
            launch = f"{'PROFILE_PREFIX=' + prefix + ' ' if prefix else ''}horovodrun -np {hvd.size()} --gloo python"
            with open(path, "w") as stream:
                stream.write(f"# {name}: {STEPS} steps on rank 0, {' '.join([launch] + sys.argv)}\n")
                stream.write(table)
            print(f"{name}:\n{table}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
