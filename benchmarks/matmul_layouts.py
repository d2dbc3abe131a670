"""PowerSGD's three products at ResNet-18's layer shapes, on one CPU thread, in two layouts:
``a @ b`` as written, and (bᵀ aᵀ)ᵀ with bᵀ contiguous, which ``TorchTensorOps.matmul`` uses
on the CPU for a tall, thin b. Microseconds per step, summed over the shapes.

    python benchmarks/matmul_layouts.py --out benchmarks/results/matmul_layouts.json
"""
import argparse
import json
import time

import torch

SHAPES = [(64, 576), (128, 1152), (256, 2304), (512, 4608), (128, 576), (256, 1152), (512, 2304)]
LAYOUTS = {"a @ b": lambda a, b: a @ b, "(bT aT)T": lambda a, b: (b.T.contiguous() @ a.T).T}


def seconds(function, repeats=15):
    function()
    started = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - started) / repeats


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for rank in (1, 2, 4):
        totals = {}
        for n, m in SHAPES:
            matrix, q, p = torch.randn(n, m), torch.randn(m, 4)[:, :rank], torch.randn(n, rank)
            for product, (a, b) in {"M Q": (matrix, q), "MT P": (matrix.T, p), "P QT": (p, q.T)}.items():
                for layout, function in LAYOUTS.items():
                    key = (product, layout)
                    totals[key] = totals.get(key, 0.0) + seconds(lambda: function(a, b))
        for (product, layout), total in totals.items():
            rows.append({"rank": rank, "product": product, "layout": layout, "us_per_step": round(total * 1e6)})
            print(f"r={rank} {product:5s} {layout:9s} {total * 1e6:8.0f} us")
    if args.out:
        with open(args.out, "w") as stream:
            json.dump({"command": "python benchmarks/matmul_layouts.py --out " + args.out, "shapes": SHAPES,
                       "machine": f"torch {torch.__version__}, 1 thread, {torch.backends.cpu.get_cpu_capability()}",
                       "rows": rows}, stream, indent=1)


if __name__ == "__main__":
    main()
