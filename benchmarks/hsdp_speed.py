"""Seconds per step and bytes across the slow link of ResNet-18 (CIFAR shapes) under FSDP2's hybrid
sharding, 2 replicas × 2 shards: native HSDP (uncompressed) against Accordion's exchange on the shards.

Run by ``benchmarks/hsdp_link.sh``, two ``torchrun`` nodes of 2 processes, each node a network
namespace: inside a node the shard group's reduce-scatter and all-gathers use its loopback (fast);
the replicas' all-reduce crosses the veth pair between the namespaces (the slow link, ``tbf``).

Every variant is built once and timed in rounds, all interleaved in one job. A figure is the median
of the timed steps of every round, after each round's warm-up step. ``replica_bytes_per_step`` is
what each rank sends across replicas by Accordion's own count (for native HSDP, its padded shards'
bytes); ``veth_bytes_per_step`` is what this node's veth sent per step, measured by the kernel,
all ranks of the node and every collective on it together.
"""
import argparse
import json
import os
import platform
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from horovod_accordion.advise.models import resnet18_cifar
from horovod_accordion.fsdp import AccordionState, Compression, PowerSGD, TopK

BATCH = 16
VARIANTS = {  # name -> compression; None: native HSDP
    "native hsdp": None,
    "none": Compression.none,
    "fp16": Compression.fp16,
    "powersgd:4": PowerSGD(4),
    "powersgd:1": PowerSGD(1),
    "topk:0.1": TopK(0.1),
}


def build(compression, mesh):
    """A sharded ResNet-18: every residual block a unit, the root the rest."""
    model = resnet18_cifar()
    on = mesh if compression is None else mesh["shard"]
    for block in model:
        if list(block.children()):  # a residual block; the stem and the head stay in the root
            fully_shard(block, mesh=on)
    fully_shard(model, mesh=on)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    state = None if compression is None else AccordionState(mesh, compression, model=model, optimizer=optimizer,
                                                            window_steps=10 ** 6)
    return model, optimizer, state


def padded_shard_bytes(model):
    """What native HSDP all-reduces across replicas per rank and step: its padded fp32 shards."""
    return sum(fsdp_param.padded_sharded_param_size.numel() * 4
               for module in model.modules() if isinstance(module, FSDPModule)
               for group in module._get_fsdp_state()._fsdp_param_groups for fsdp_param in group.fsdp_params)


def veth_bytes(interface):
    with open(f"/sys/class/net/{interface}/statistics/tx_bytes") as stream:
        return int(stream.read())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--link", required=True, help="the slow link's name, e.g. 100mbit")
    parser.add_argument("--veth", required=True, help="this node's veth interface")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant and round")
    parser.add_argument("--out", required=True)
    parser.add_argument("--command", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    runs = {name: build(compression, mesh) for name, compression in VARIANTS.items()}
    generator = torch.Generator().manual_seed(rank)
    times = {name: [] for name in runs}
    veth = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (model, optimizer, state) in runs.items():
            for step in range(1 + args.steps):
                x = torch.randn(BATCH, 3, 32, 32, generator=generator)
                y = torch.randint(0, 10, (BATCH,), generator=generator)
                dist.barrier()
                sent, started = veth_bytes(args.veth), time.perf_counter()
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                dist.barrier()
                if step > 0:
                    times[name].append(time.perf_counter() - started)
                    veth[name].append(veth_bytes(args.veth) - sent)
    if rank != 0:
        return
    native_bytes = padded_shard_bytes(runs["native hsdp"][0])
    result = {}
    for name, (model, optimizer, state) in runs.items():
        sent = native_bytes if state is None else statistics.median(state.accordion_stats()["bytes_per_step"])
        result[name] = {"median_step_s": round(statistics.median(times[name]), 4),
                        "step_s": [round(t, 4) for t in times[name]],
                        "replica_bytes_per_step": sent,
                        "veth_bytes_per_step": int(statistics.median(veth[name]))}
    native = result["native hsdp"]["median_step_s"]
    for row in result.values():
        row["time_vs_native"] = round(row["median_step_s"] / native, 3)
    record = {}
    if os.path.exists(args.out):
        with open(args.out) as stream:
            record = json.load(stream)
    record.setdefault("links", {})[args.link] = result
    record.update({"command": args.command, "model": "resnet18-cifar (11.17 M parameters)", "batch_per_rank": BATCH,
                   "layout": "2 replicas x 2 shards, 2 torchrun nodes of 2 processes, 1 thread each, on a 2-core "
                             "machine; the replica all-reduce crosses a veth pair limited by tbf, the shard group "
                             "uses its node's loopback",
                   "rounds": args.rounds, "timed_steps_per_round": args.steps,
                   "machine": f"{platform.machine()}, torch {torch.__version__}",
                   "date": time.strftime("%Y-%m-%d")})
    with open(args.out, "w") as stream:
        json.dump(record, stream, indent=1)
    for name, row in result.items():
        print(f"{args.link} {name:12s} {row['median_step_s']:.3f} s/step ({row['time_vs_native']:.2f}x native), "
              f"{row['replica_bytes_per_step'] / 1e6:.2f} MB across replicas per rank, "
              f"veth {row['veth_bytes_per_step'] / 1e6:.2f} MB per step", flush=True)


if __name__ == "__main__":
    main()
