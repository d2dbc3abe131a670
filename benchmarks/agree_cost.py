"""What the learning rate's agreement costs a step: ``agree_max``, the blocking 8-byte host
allreduce that an adaptive step makes before its first bucket, timed on 2 ranks through Horovod
(torch, the Horovod optimizer's) and through torch.distributed's Gloo (the DDP hook's).

    PYTHONPATH=. OMP_NUM_THREADS=1 horovodrun -np 2 --gloo python benchmarks/agree_cost.py \\
        --out benchmarks/results/agree_cost.json
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import horovod_accordion.torch as hvd
from horovod_accordion.hooks.ops import DistributedCollectives
from horovod_accordion.torch.ops import TorchCollectives
from horovod_accordion.torch_common.tensors import TorchTensorOps


def microseconds_per_call(collectives, calls):
    collectives.agree_max(0.1, "warm-up")
    started = time.perf_counter()
    for call in range(calls):
        collectives.agree_max(0.1 * (1 + hvd.rank()), "lr")
    return (time.perf_counter() - started) / calls * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29536")
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())
    tensors = TorchTensorOps()
    backends = {"horovod (torch optimizer)": TorchCollectives(tensors, hvd.global_process_set),
                "torch.distributed gloo (DDP hook)": DistributedCollectives(tensors)}
    rounds = {name: [microseconds_per_call(collectives, args.calls) for _ in range(args.rounds)]
              for name, collectives in backends.items()}
    results = {name: {"median_us": round(statistics.median(times), 1), "round_us": [round(t, 1) for t in times]}
               for name, times in rounds.items()}
    if hvd.rank() == 0:
        print(json.dumps(results, indent=1), flush=True)
        if args.out:
            with open(args.out, "w") as stream:
                json.dump({"command": " ".join(["horovodrun -np 2 --gloo python"] + sys.argv),
                           "what": f"microseconds per agree_max call, {args.calls} calls per round, 2 ranks on "
                                   f"one machine (unlimited loopback), 1 thread each",
                           "results": results}, stream, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
