"""Where a variant of ``speed.py`` spends its step: torch.profiler on rank 0, top entries by
self CPU time, written to ``benchmarks/results/profile_<variant>.txt``, or with
``PROFILE_PREFIX=overhead_`` (one process, for ``overhead.py``) ``overhead_profile_<variant>.txt``.

    horovodrun -np 2 --gloo python benchmarks/profile_step.py "ours topk 0.1" "ours powersgd r1"

Time spent waiting for a Horovod collective shows up as the self time of the call that
waits (``Optimizer.step`` for ours: ``synchronize()`` runs inside it).
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import horovod_accordion.torch as hvd
from benchmarks.speed import BATCH, VARIANTS, Variant

STEPS = 3


def main(names):
    hvd.init()
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29534")
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())
    generator = torch.Generator().manual_seed(hvd.rank())

    def batch():
        return torch.randn(BATCH, 3, 32, 32, generator=generator), torch.randint(0, 10, (BATCH,), generator=generator)

    for name in names:
        variant = Variant(name, *VARIANTS[name])
        for _ in range(3):
            variant.step(*batch())
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(STEPS):
                variant.step(*batch())
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
