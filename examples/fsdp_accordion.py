"""Accordion on FSDP2's hybrid sharding, without Horovod: the demo MLP on the embedded digits dataset,
2 replicas × 2 shards.

    torchrun --nproc_per_node 4 examples/fsdp_accordion.py --shards 2

Each hidden layer is a ``fully_shard`` unit on the mesh's shard dimension; the state averages each
rank's shards across the replicas. PowerSGD runs at rank 2 (ℓ_low) in critical regimes and rank 1
(ℓ_high) elsewhere; each check prints every layer's level.
"""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from horovod_accordion.examples.ddp_loop import COMPRESSIONS, argument_parser
from horovod_accordion.examples.runs import announce, say
from horovod_accordion.fsdp import AccordionState
from example_data import digits_shards
from progress import train_with_epoch_windows


def parse_args():
    parser = argument_parser(__doc__)
    parser.add_argument("--shards", type=int, default=2, help="ranks per replica; the world size must divide by it")
    return parser.parse_args()


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))
    size = dist.get_world_size()
    mesh = init_device_mesh("cpu", (size // args.shards, args.shards), mesh_dim_names=("replicate", "shard"))
    for compression in args.compression:
        train(args, compression, mesh)
    dist.destroy_process_group()


def train(args, compression, mesh):
    rank, size = dist.get_rank(), dist.get_world_size()
    announce(rank, compression)
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = (torch.from_numpy(a) for a in digits_shards(rank, size))
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=args.decay_epoch, gamma=0.1)
    state = AccordionState(mesh, COMPRESSIONS[compression], model=model, optimizer=optimizer,
                           interval=args.interval)

    accuracy = train_with_epoch_windows(state, model, optimizer, scheduler, (x_train, y_train, x_test, y_test),
                                        args, rank, "fsdp")
    if rank == 0:
        sent = state.accordion_stats()["total_bytes_sent"] / 1e3
        say(f"[rank 0] {compression}: test accuracy {accuracy:.3f}, {sent:.1f} kB sent per rank across "
            f"replicas, state kept {state.kept_bytes / 1e3:.1f} kB")


if __name__ == "__main__":
    main()
