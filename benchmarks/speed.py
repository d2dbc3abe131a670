"""Seconds per step of ResNet-18 (CIFAR shapes), ours against stock Horovod and torch DDP.

Run by ``benchmarks/speed.sh`` once per link, inside that link's network namespace:

    horovodrun -np 2 --gloo python benchmarks/speed.py --link 100mbit --rate-mbit 100 \\
        --out benchmarks/results/speed_resnet18.json

Every variant is built once and timed in rounds, all interleaved in one job, so the ratios
come from the same machine at the same time; DDP runs in the same processes over its own
Gloo process group on the same link. A figure is the median of the timed steps of every
round, after each round's warm-up steps. ``bytes_per_step`` is what crosses each rank's link:
Accordion's own count (``wire_bytes_per_step``) for ours, the shapes' count for Horovod and DDP
(the same rules as torch's ``powerSGD_hook``). ``wire_bound_s`` is the time the shared link needs
for both ranks' bytes.
``median_forward_s`` is the forward pass alone, timed in the same steps: the advisor's
validation (``advise_validation.py``) scales its profile by it, per variant.
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
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as horovod
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook, quantization_hooks

import horovod_accordion.torch as hvd
from horovod_accordion import ddp as accordion_ddp
from horovod_accordion.advise.models import resnet18_cifar
from horovod_accordion.core.compression import PowerSGD, matrix_shape, powersgd_compresses

BATCH = 16


def ours(compression, **accordion):
    def build(model):
        return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                        named_parameters=model.named_parameters(), compression=compression,
                                        **accordion)
    return build


def ddp(hook=None, state=None, bucket_cap_mb=None):
    def build(model):
        wrapped = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
        if hook is not None:
            wrapped.register_comm_hook(state() if callable(state) else state, hook)
        return wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.01, momentum=0.9), None
    return build


def ddp_accordion(compression, **accordion):
    """DDP with Accordion's hook, in DDP's default buckets (25 MB)."""
    def build(model):
        wrapped = nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01, momentum=0.9)
        state = accordion_ddp.AccordionState(compression=compression, model=wrapped, optimizer=optimizer,
                                             **accordion)
        wrapped.register_comm_hook(state, accordion_ddp.accordion_hook)
        return wrapped, optimizer, state
    return build


def powersgd_state(rank):
    return lambda: powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                               start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)


# Accordion with checks inside the timed steps: a window per step, a check per window.
CHECKING = dict(window_steps=1, interval=1)
VARIANTS = {
    "compute only": ("local", None),
    "stock horovod": ("horovod", None),
    "ours none": ("ours", ours(hvd.Compression.none)),
    "ours fp16": ("ours", ours(hvd.Compression.fp16)),
    "ours powersgd r1": ("ours", ours(hvd.Compression.powersgd(1))),
    # As torch's hook with its one bucket: everything after backward, nothing beside it.
    "ours powersgd r1 one bucket": ("ours", ours(hvd.Compression.powersgd(1), bucket_cap_mb=None)),
    "ours powersgd r2": ("ours", ours(hvd.Compression.powersgd(2))),
    "ours powersgd r4": ("ours", ours(hvd.Compression.powersgd(4))),
    "ours accordion powersgd 2/1": ("ours", ours(hvd.Compression.powersgd(2, 1), **CHECKING)),
    "ours topk 0.01": ("ours", ours(hvd.Compression.topk(0.01))),
    "ours topk 0.1": ("ours", ours(hvd.Compression.topk(0.1))),
    "ours accordion topk 0.99/0.1": ("ours", ours(hvd.Compression.topk(0.99, 0.1), **CHECKING)),
    "ours quantized 8": ("ours", ours(hvd.Compression.quantized(8))),
    "ours quantized 4": ("ours", ours(hvd.Compression.quantized(4))),
    "ddp allreduce": ("ddp", ddp()),
    "ddp fp16_compress_hook": ("ddp", ddp(default_hooks.fp16_compress_hook, None)),
    # torch's 8-bit hook: every rank's uint8 copy of a bucket, all-gathered, with no error feedback.
    "ddp quantization_pertensor_hook": ("ddp", ddp(quantization_hooks.quantization_pertensor_hook, None)),
    # One bucket: with several, torch's hook issues a bucket's P and Q allreduces from Gloo's
    # callback thread, racing the next bucket's allreduce, and aborted every job here ("Received
    # data size doesn't match expected size").
    "ddp powersgd r1": ("ddp", ddp(powerSGD_hook.powerSGD_hook, powersgd_state(1), bucket_cap_mb=100)),
    "ddp powersgd r2": ("ddp", ddp(powerSGD_hook.powerSGD_hook, powersgd_state(2), bucket_cap_mb=100)),
    "ddp accordion hook r1": ("ddp", ddp_accordion(PowerSGD(1))),
    "ddp accordion hook r2": ("ddp", ddp_accordion(PowerSGD(2))),
    "ddp accordion hook 2/1": ("ddp", ddp_accordion(PowerSGD(2, 1), **CHECKING)),
    # Mixed precision and torch.compile, timed by overhead.py only (the third field is the mode).
    "ours powersgd r1 amp": ("ours", ours(hvd.Compression.powersgd(1)), "amp"),
    "ours accordion powersgd 2/1 amp": ("ours", ours(hvd.Compression.powersgd(2, 1), **CHECKING), "amp"),
    "ours powersgd r1 bf16": ("ours", ours(hvd.Compression.powersgd(1)), "bf16"),
    "ours accordion powersgd 2/1 bf16": ("ours", ours(hvd.Compression.powersgd(2, 1), **CHECKING), "bf16"),
    "ddp powersgd r1 bf16": ("ddp", ddp(powerSGD_hook.powerSGD_hook, powersgd_state(1), bucket_cap_mb=100), "bf16"),
    "stock horovod compiled": ("horovod", None, "compiled"),
    "ours none compiled": ("ours", ours(hvd.Compression.none), "compiled"),
}


def group_of(name):
    """The job a variant runs in (see speed.sh): DDP's PowerSGD hooks, torch's and ours, together.
    The mixed-precision and compiled variants are overhead.py's alone."""
    if len(VARIANTS[name]) > 2:
        return "overhead"
    if name.startswith(("ddp powersgd", "ddp accordion")):
        return "ddp-powersgd"
    return "ddp" if name.startswith("ddp") else "ours"


def shape_bytes(model, kind, rank=None):
    """Bytes each rank sends per step, from the parameter shapes."""
    shapes = [tuple(p.shape) for p in model.parameters()]
    if kind == "dense":
        return 4 * sum(torch.Size(s).numel() for s in shapes)
    if kind == "fp16":
        return 2 * sum(torch.Size(s).numel() for s in shapes)
    if kind == "uint8":  # and a scale and zero point per bucket
        return sum(torch.Size(s).numel() for s in shapes)
    config = PowerSGD(rank, rank)
    return 4 * sum(rank * sum(matrix_shape(s)) if powersgd_compresses(s, config) else torch.Size(s).numel()
                   for s in shapes)


class Variant:
    """``mode``: ``None`` (fp32), ``"amp"`` (fp16 autocast and a GradScaler, with the recipe each
    entry point documents), ``"bf16"`` (bf16 autocast) or ``"compiled"`` (``torch.compile`` of the
    model, or of the DDP model)."""

    def __init__(self, name, kind, build, mode=None):
        self.name, self.kind, self.mode = name, kind, mode
        self.scaler = torch.amp.GradScaler("cpu", enabled=mode == "amp")
        self.model = resnet18_cifar()
        self.state = None  # Accordion's, for our DDP hook
        if kind == "ours":
            self.optimizer = build(self.model)
            self.optimizer.grad_scaler = self.scaler if mode == "amp" else None
            self.forward = self.model
        elif kind == "ddp":
            self.forward, self.optimizer, self.state = build(self.model)
        else:
            self.forward = self.model
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
            if kind == "horovod":
                self.optimizer = horovod.DistributedOptimizer(self.optimizer,
                                                              named_parameters=self.model.named_parameters())
        if mode == "compiled":
            self.forward = torch.compile(self.forward)
        self.times, self.forward_times = [], []

    def step(self, x, y):
        """Seconds for the whole step, and for its forward pass: compute before the step's
        gradient collectives (DDP's forward only broadcasts BatchNorm's 38 kB of buffers), so
        it tracks how fast this shared machine runs at that moment."""
        started = time.perf_counter()
        self.optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16 if self.mode == "amp" else torch.bfloat16,
                            enabled=self.mode in ("amp", "bf16")):
            loss = F.cross_entropy(self.forward(x), y)
        forward_s = time.perf_counter() - started
        if self.mode != "amp":
            loss.backward()
            self.optimizer.step()
        elif self.kind == "ours":  # the Horovod optimizer's AMP recipe (docs/concepts.md)
            self.scaler.scale(loss).backward()
            self.optimizer.synchronize()
            self.scaler.unscale_(self.optimizer)
            with self.optimizer.skip_synchronize():
                self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        return time.perf_counter() - started, forward_s

    def accordion_stats(self):
        return self.optimizer.accordion_stats() if self.kind == "ours" else \
            self.state.accordion_stats() if self.state is not None else None

    def bytes_per_step(self):
        """The bytes that cross a rank's link per step: Accordion's count, or the shapes' (at 2
        ranks an allreduce's and an allgather's are the bytes each rank hands over)."""
        if self.accordion_stats() is not None:
            return self.accordion_stats()["wire_bytes_per_step"][-1]
        if self.kind == "local":
            return 0
        if self.name == "ddp fp16_compress_hook":
            return shape_bytes(self.model, "fp16")
        if self.name == "ddp quantization_pertensor_hook":
            return shape_bytes(self.model, "uint8")
        if self.name.startswith("ddp powersgd"):
            return shape_bytes(self.model, "powersgd", rank=int(self.name[-1]))
        return shape_bytes(self.model, "dense")

    def levels(self):
        stats = self.accordion_stats()
        if stats is None or not stats["checks"]:
            return None
        return sorted({str(level) for level in stats["levels"].values()})


def start_job(master_port):
    """Horovod and a torch.distributed Gloo group over the same ranks, one thread each, as every
    benchmark of this machine runs; returns this rank's batch generator."""
    hvd.init()
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(master_port))
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())
    return torch.Generator().manual_seed(hvd.rank())


def random_batch(generator):
    return torch.randn(BATCH, 3, 32, 32, generator=generator), torch.randint(0, 10, (BATCH,), generator=generator)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--link", required=True, help="the key in the results: none, 1gbit, 100mbit")
    parser.add_argument("--rate-mbit", type=float, help="the link's rate, for the wire bound")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of every round")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", help="comma-separated subset of the variant names")
    parser.add_argument("--group", choices=["ours", "ddp", "ddp-powersgd"],
                        help="ours (with stock Horovod and compute only), DDP's allreduce and fp16 hook, or "
                             "DDP's powerSGD_hook")
    parser.add_argument("--out")
    parser.add_argument("--command", help="the command to record (speed.sh passes its own)")
    args = parser.parse_args()
    generator = start_job(master_port=29533)
    names = args.variants.split(",") if args.variants else [name for name in VARIANTS if group_of(name) in (
        args.group, None if args.group else group_of(name))]
    variants = [Variant(name, *VARIANTS[name]) for name in names]
    for _ in range(args.rounds):
        for variant in variants:
            horovod.allreduce(torch.zeros(1), name="speed.barrier")
            for step in range(args.warmup + args.steps):
                seconds, forward_s = variant.step(*random_batch(generator))
                if step >= args.warmup:
                    variant.times.append(seconds)
                    variant.forward_times.append(forward_s)
            if hvd.rank() == 0:
                print(f"{args.link} {variant.name}: {statistics.median(variant.times[-args.steps:]):.3f} s/step",
                      flush=True)
    results = {}
    for variant in variants:
        sent = variant.bytes_per_step()
        rounds = [variant.times[r * args.steps:(r + 1) * args.steps] for r in range(args.rounds)]
        results[variant.name] = {
            "median_step_s": round(statistics.median(variant.times), 4),
            "round_medians_s": [round(statistics.median(times), 4) for times in rounds],
            "median_forward_s": round(statistics.median(variant.forward_times), 4),
            "bytes_per_step": sent,
            "wire_bound_s": None if args.rate_mbit is None else
            round(hvd.size() * sent * 8 / (args.rate_mbit * 1e6), 4),
        }
        if variant.levels() is not None:
            results[variant.name]["levels_at_end"] = variant.levels()
    if hvd.rank() == 0 and args.out:
        record = json.load(open(args.out)) if os.path.exists(args.out) else {}
        command = args.command or " ".join([sys.executable] + sys.argv)
        record.setdefault("command", command)
        record["commands"] = sorted(set(record.get("commands", [record["command"]])) | {command})
        record.update({
            "model": "resnet18-cifar", "batch_per_rank": BATCH, "ranks": hvd.size(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
                       f"1 thread per rank, Gloo",
            "timing": f"median of {args.rounds} rounds x {args.steps} timed steps, {args.warmup} warm-up steps "
                      f"per round; per link, three jobs back to back, each with its variants interleaved: "
                      f"ours with stock Horovod and compute only; DDP allreduce and fp16; DDP PowerSGD hooks, "
                      f"torch's and Accordion's",
        })
        record.setdefault("links", {}).setdefault(args.link, {}).update(results)
        with open(args.out, "w") as stream:
            json.dump(record, stream, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
