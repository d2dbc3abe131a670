"""The cost of a DDP communication hook's own work, on one process, where the wire costs
nothing: DDP's allreduce, torch's ``fp16_compress_hook`` and ``powerSGD_hook``, and
Accordion's hook with every compression, on one device (a GPU where there is one). It needs
no Horovod, so it runs where only torch is installed.

    torchrun --nproc_per_node 1 benchmarks/ddp_hook_cost.py --device cuda \\
        --out benchmarks/results/ddp_hook_cost_h200.json

Every variant is built once and timed in interleaved rounds; a figure is the median over
every timed step of every round, each step waited for on the device. ``--profile DIR`` then
profiles 5 steps of each variant (torch.profiler, CPU and the device) and writes the top entries
by self CPU time to ``DIR/ddp_hook_profile_<model>_<variant>.txt``.
"""
import argparse
import json
import platform
import statistics
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from horovod_accordion.advise.models import resnet18_cifar
from horovod_accordion.ddp import AccordionState, Compression, PowerSGD, accordion_hook

MODELS = {"resnet18-cifar": (resnet18_cifar, (3, 32, 32), 16)}


def torchvision_resnet50():
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.resnet50()


MODELS["resnet50-imagenet"] = (torchvision_resnet50, (3, 224, 224), 64)


def torch_powersgd(rank):
    return lambda: powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                               start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)


def accordion(compression, **options):
    return lambda: AccordionState(compression=compression, window_steps=1, interval=1, **options)


# name -> (hook, a function that builds its state); None: no DDP at all.
VARIANTS = {
    "compute only": None,
    "ddp allreduce": (None, None),
    "ddp fp16_compress_hook": (default_hooks.fp16_compress_hook, lambda: None),
    "ddp powerSGD_hook r1": (powerSGD_hook.powerSGD_hook, torch_powersgd(1)),
    "ddp powerSGD_hook r2": (powerSGD_hook.powerSGD_hook, torch_powersgd(2)),
    "accordion hook none": (accordion_hook, accordion(Compression.none)),
    "accordion hook fp16": (accordion_hook, accordion(Compression.fp16)),
    "accordion hook powersgd r1": (accordion_hook, accordion(PowerSGD(1))),
    "accordion hook powersgd r2": (accordion_hook, accordion(PowerSGD(2))),
    "accordion hook powersgd 2/1, a check every step": (accordion_hook, accordion(PowerSGD(2, 1))),
}


def build(name, factory, device):
    model = factory().to(device)
    variant = VARIANTS[name]
    if variant is not None:
        hook, state = variant
        model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
        if hook is not None:
            model.register_comm_hook(state(), hook)
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def write_profile(model, optimizer, x, y, device, path, steps=5):
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    with open(path, "w") as stream:
        stream.write(f"{steps} steps; top entries by self CPU time\n")
        stream.write(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="resnet18-cifar,resnet50-imagenet")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out")
    parser.add_argument("--profile", metavar="DIR", help="also write each variant's profile here")
    args = parser.parse_args()
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    wait = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    results = {}
    for model_name in args.models.split(","):
        factory, shape, batch = MODELS[model_name]
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(batch, *shape, generator=generator).to(device)
        y = torch.randint(0, 10, (batch,), generator=generator).to(device)
        built = {name: build(name, factory, device) for name in VARIANTS}
        times = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):
            for name, (model, optimizer) in built.items():
                for k in range(args.warmup + args.steps):
                    wait()
                    started = time.perf_counter()
                    optimizer.zero_grad()
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    optimizer.step()
                    wait()
                    if k >= args.warmup:
                        times[name].append(time.perf_counter() - started)
        if args.profile:
            for name, (model, optimizer) in built.items():
                write_profile(model, optimizer, x, y, device, f"{args.profile}/ddp_hook_profile_{model_name}_"
                              f"{name.split(',')[0].replace(' ', '_').replace('/', '-')}.txt")
        medians = {name: statistics.median(t) for name, t in times.items()}
        results[model_name] = {
            "batch": batch, "input_shape": list(shape),
            "median_step_ms": {name: round(1e3 * m, 3) for name, m in medians.items()},
            "ours / torch's": {
                "powersgd r1": round(medians["accordion hook powersgd r1"] / medians["ddp powerSGD_hook r1"], 3),
                "powersgd r2": round(medians["accordion hook powersgd r2"] / medians["ddp powerSGD_hook r2"], 3),
                "none / ddp allreduce": round(medians["accordion hook none"] / medians["ddp allreduce"], 3),
                "fp16 / fp16_compress_hook": round(medians["accordion hook fp16"] / medians["ddp fp16_compress_hook"],
                                                   3),
            },
        }
        print(json.dumps({model_name: results[model_name]}, indent=1), flush=True)
    record = {"command": "torchrun --nproc_per_node 1 benchmarks/ddp_hook_cost.py " + " ".join(
                  f"--{k} {v}" for k, v in vars(args).items() if v is not None and k not in ("out", "profile")),
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
              "torch": torch.__version__, "timed_steps_per_variant": args.steps * args.rounds, "results": results}
    if args.out:
        with open(args.out, "w") as stream:
            json.dump(record, stream, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
