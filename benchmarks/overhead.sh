#!/usr/bin/env bash
# Our code's own cost, one process per framework, and mixed precision and compiled rows (see
# overhead.py): about 20 minutes on 2 cores.
# Run it on an otherwise idle machine:
#   bash benchmarks/overhead.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results/overhead_resnet18.json
rm -f "$out"
for framework in torch torch-precision tf; do
    env PATH="$PWD/.venv/bin:$PATH" OMP_NUM_THREADS=1 PYTHONPATH="$PWD" TF_CPP_MIN_LOG_LEVEL=2 \
        timeout 1800 horovodrun -np 1 --gloo python benchmarks/overhead.py "$framework" --out "$out" \
        --command "bash benchmarks/overhead.sh" | sed -n 's/^\[0\]<stdout>://p'
done
echo "wrote $out"
