"""The cost of our code alone: one process, where the wire costs nothing and the machine's
noise is lowest, ResNet-18 (CIFAR shapes, batch 16, 1 thread) in torch and a Keras ResNet-50
(CIFAR shapes) through the TF tape.

    horovodrun -np 1 --gloo python benchmarks/overhead.py torch --out benchmarks/results/overhead_resnet18.json
    horovodrun -np 1 --gloo python benchmarks/overhead.py tf --out benchmarks/results/overhead_resnet18.json

``benchmarks/overhead.sh`` runs both. Every variant is built once and timed in interleaved
rounds (``speed.py``'s variants, DDP with world size 1 over Gloo). A figure is the median over
every timed step of every round; ``median_cpu_s`` is the process's CPU time per step
(``time.process_time``), which the machine's other load disturbs less than wall time.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TORCH_VARIANTS = ["compute only", "stock horovod", "ours none", "ours fp16", "ours powersgd r1", "ours powersgd r2",
                  "ours accordion powersgd 2/1", "ddp allreduce", "ddp powersgd r1", "ddp powersgd r2",
                  "ddp accordion hook r1", "ddp accordion hook r2"]
# ``overhead.py torch-precision``: AMP (fp16 autocast and a GradScaler), bf16 autocast, torch.compile.
PRECISION_VARIANTS = ["ours powersgd r1 amp", "ours accordion powersgd 2/1 amp", "ours powersgd r1 bf16",
                      "ours accordion powersgd 2/1 bf16", "ddp powersgd r1 bf16", "stock horovod compiled",
                      "ours none compiled"]
TF_VARIANTS = ["compute only", "stock horovod tape", "ours none", "ours powersgd r1"]

# (what, numerator, denominator, target): each ratio of median step times the issue asks for.
TARGETS = [
    ("torch: ours none / stock horovod", "ours none", "stock horovod", 1.02),
    ("torch: ours powersgd r1 / torch powerSGD_hook r1", "ours powersgd r1", "ddp powersgd r1", 1.0),
    ("torch: ours powersgd r2 / torch powerSGD_hook r2", "ours powersgd r2", "ddp powersgd r2", 1.0),
    ("torch: our DDP hook r1 / torch powerSGD_hook r1", "ddp accordion hook r1", "ddp powersgd r1", 1.0),
    ("torch: our DDP hook r2 / torch powerSGD_hook r2", "ddp accordion hook r2", "ddp powersgd r2", 1.0),
    ("torch: accordion 2/1 checking every step / static r1", "ours accordion powersgd 2/1", "ours powersgd r1", 1.03),
    ("tf tape: ours none / stock horovod tape", "tf ours none", "tf stock horovod tape", 1.02),
    ("torch AMP: accordion 2/1 checking every step / static r1", "ours accordion powersgd 2/1 amp",
     "ours powersgd r1 amp", 1.03),
    ("torch compiled: ours none / stock horovod", "ours none compiled", "stock horovod compiled", 1.02),
]


def time_rounds(steppers, warmup, steps, rounds, barrier):
    """``steppers``: name -> a function that runs one step and waits for it."""
    wall = {name: [] for name in steppers}
    cpu = {name: [] for name in steppers}
    for _ in range(rounds):
        for name, step in steppers.items():
            barrier()
            for k in range(warmup + steps):
                started, started_cpu = time.perf_counter(), time.process_time()
                step(k)
                if k >= warmup:
                    wall[name].append(time.perf_counter() - started)
                    cpu[name].append(time.process_time() - started_cpu)
            print(f"{name}: {statistics.median(wall[name][-steps:]):.4f} s/step", flush=True)
    return {name: {"median_step_s": round(statistics.median(wall[name]), 4),
                   "median_cpu_s": round(statistics.median(cpu[name]), 4),
                   "round_medians_s": [round(statistics.median(wall[name][r * steps:(r + 1) * steps]), 4)
                                       for r in range(rounds)],
                   "timed_steps": len(wall[name])}
            for name in steppers}


def run_torch(args, names=TORCH_VARIANTS):
    import torch
    import torch.distributed as dist
    import horovod.torch as horovod
    import horovod_accordion.torch as hvd
    from speed import BATCH, VARIANTS, Variant

    hvd.init()
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("gloo", rank=0, world_size=1)
    variants = {name: Variant(name, *VARIANTS[name]) for name in names}
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(BATCH, 3, 32, 32, generator=generator), torch.randint(0, 10, (BATCH,), generator=generator))
               for _ in range(4)]
    results = time_rounds({name: (lambda k, v=variant: v.step(*batches[k % len(batches)]))
                           for name, variant in variants.items()},
                          args.warmup, args.steps, args.rounds, lambda: horovod.allreduce(torch.zeros(1)))
    dist.destroy_process_group()
    return results, f"torch {torch.__version__}"


def run_tf(args):
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf
    import horovod.tensorflow as horovod
    import horovod_accordion.tensorflow as hvd
    from tf_speed import BATCH, VARIANTS, variant

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    built = {name: variant(*VARIANTS[name]) for name in TF_VARIANTS}
    rng = tf.random.Generator.from_seed(0)
    batches = [(rng.normal((BATCH, 32, 32, 3)), rng.uniform((BATCH,), 0, 10, dtype=tf.int64)) for _ in range(4)]

    def stepper(step, state):
        def run(k):
            float(step(*batches[k % len(batches)]))  # waits for the step
            if state is not None:
                state.step_end()
        return run

    results = time_rounds({f"tf {name}": stepper(step, state) for name, (_, state, step) in built.items()},
                          args.warmup, args.steps, args.rounds, lambda: horovod.allreduce(tf.zeros(1)))
    return results, f"TF {tf.__version__}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=["torch", "torch-precision", "tf"])
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps at the start of every round")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out")
    parser.add_argument("--command", help="the command to record (overhead.sh passes its own)")
    args = parser.parse_args()
    if args.framework == "torch-precision":
        results, stack = run_torch(args, PRECISION_VARIANTS)
    else:
        results, stack = (run_torch if args.framework == "torch" else run_tf)(args)
    if not args.out:
        return
    record = {}
    if os.path.exists(args.out):
        with open(args.out) as stream:
            record = json.load(stream)
    command = args.command or " ".join([sys.executable] + sys.argv)
    record["commands"] = sorted(set(record.get("commands", [])) | {command})
    record.update({
        "model": "torch: resnet18-cifar; tf: keras resnet50 (32x32x3, 10 classes)", "batch": 16, "ranks": 1,
        "timing": f"median of {args.rounds} rounds x {args.steps} timed steps, {args.warmup} warm-up steps per "
                  f"round, the variants of one framework interleaved in one job; median_cpu_s: CPU time per step",
        "note": "one process: Horovod's optimizer and tape skip their collectives there, and so do ours with none "
                "and fp16, so those two ratios measure the bookkeeping around the step only; PowerSGD and the DDP "
                "hooks run their collectives over one rank",
    })
    record.setdefault("machine", {})[args.framework.split("-")[0]] = \
        f"{platform.machine()}, {os.cpu_count()} cores, {stack}, 1 thread, one process (horovodrun -np 1, Gloo)"
    record.setdefault("variants", {}).update(results)
    variants = record["variants"]
    record["targets"] = [
        {"what": what, "target": target,
         "ratio": round(variants[a]["median_step_s"] / variants[b]["median_step_s"], 3),
         "cpu_ratio": round(variants[a]["median_cpu_s"] / variants[b]["median_cpu_s"], 3),
         "met": variants[a]["median_step_s"] / variants[b]["median_step_s"] <= target}
        for what, a, b, target in TARGETS if a in variants and b in variants]
    with open(args.out, "w") as stream:
        json.dump(record, stream, indent=2)


if __name__ == "__main__":
    main()
