"""``mpirun -np 4``: Horovod initialised on an mpi4py communicator, with two process sets
built from ``MPI.COMM_WORLD.Split``. Each set trains its own model with adaptive PowerSGD
(``verify_levels`` on), on data of its own. Used by ``tests/test_mpi4py.py``; each rank writes
``DIR/rank<r>.json``."""
import json
import os
import sys

import torch
from mpi4py import MPI

import horovod_accordion.torch as hvd
from horovod_accordion.torch import Compression
from tests.workers.torch_checks import make_model


def main(directory):
    world = MPI.COMM_WORLD
    color = world.rank % 2  # set 0: ranks 0 and 2; set 1: ranks 1 and 3
    own = hvd.ProcessSet(world.Split(color=color, key=world.rank))  # each rank passes its own half
    hvd.init(comm=world, process_sets=[own])
    torch.set_num_threads(1)
    model = make_model(seed=color)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1, min_compression_rate=0),
                                         process_set=own, window_steps=2, interval=1, verify_levels=True)
    for step in range(24):
        generator = torch.Generator().manual_seed(1000 * world.rank + step)
        scale = 1.0 if color == 0 else (10.0 if step >= 8 else 1.0)  # only set 1's data changes regime
        x, y = torch.randn(16, 20, generator=generator) * scale, torch.randint(0, 4, (16,), generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    checks = [check["levels"] for check in optimizer.accordion_stats()["checks"]]
    hvd.barrier()  # a rank that exits shuts Horovod down for the other set too
    with open(os.path.join(directory, f"rank{world.rank}.json"), "w") as stream:
        json.dump({"set": color, "set_ranks": own.ranks, "set_rank": own.rank(), "checks": checks,
                   "weights": [float(p.detach().double().sum()) for p in model.parameters()]}, stream)


if __name__ == "__main__":
    main(sys.argv[1])
