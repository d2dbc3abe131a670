"""Wire bytes as Accordion counts them against the kernel's: 2 ranks in two network namespaces
joined by a veth pair (``wire_veth.sh``), DDP with Accordion's hook over Gloo. Each rank reads its
veth's ``tx_bytes`` around its timed steps and compares them with ``wire_bytes_per_step``; the
kernel adds the TCP/IP headers (about 3 % at 64 KiB segments) and Gloo's own messages.
"""
import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from horovod_accordion.advise.models import resnet18_cifar
from horovod_accordion.ddp import AccordionState, Compression, PowerSGD, Quantized, accordion_hook

COMPRESSIONS = {"none": Compression.none, "quantized 8": Quantized(8), "quantized 4": Quantized(4),
                "quantized 2": Quantized(2), "powersgd 4": PowerSGD(4)}


def tx_bytes(device):
    with open(f"/sys/class/net/{device}/statistics/tx_bytes") as stream:
        return int(stream.read())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--veth", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out")
    parser.add_argument("--command")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(dist.get_rank())
    rows = {}
    for name, compression in COMPRESSIONS.items():
        model = DistributedDataParallel(resnet18_cifar())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        state = AccordionState(compression=compression, model=model, optimizer=optimizer)
        model.register_comm_hook(state, accordion_hook)
        kernel = []
        for step in range(args.steps + 1):  # the first step builds DDP's buckets: untimed
            x, y = torch.randn(8, 3, 32, 32, generator=generator), torch.randint(0, 10, (8,), generator=generator)
            dist.barrier()
            before = tx_bytes(args.veth)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            after = tx_bytes(args.veth)
            dist.barrier()
            if step:
                kernel.append(after - before)
        counted = state.accordion_stats()["wire_bytes_per_step"][-1]
        rows[name] = {"wire_bytes_per_step": counted, "veth_tx_bytes_per_step": int(statistics.median(kernel)),
                      "veth_over_counted": round(statistics.median(kernel) / counted, 4)}
        if dist.get_rank() == 0:
            print(name, rows[name], flush=True)
    if dist.get_rank() == 0 and args.out:
        with open(args.out, "w") as stream:
            json.dump({"command": args.command, "model": "resnet18-cifar", "ranks": 2,
                       "what": "rank 0's veth tx_bytes per step (median of the timed steps) against "
                               "accordion_stats()['wire_bytes_per_step']", "rows": rows}, stream, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
