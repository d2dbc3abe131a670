#!/usr/bin/env bash
# cpu_per_step.py at 100 Mbit/s: PowerSGD r1 through our Horovod optimizer (DDP-like buckets, and
# one bucket after backward), torch's powerSGD_hook and our DDP hook, against compute only, in one
# job, both ranks on the loopback of a network namespace limited by tbf (as speed.sh); needs root.
#   bash benchmarks/slow_link_cpu.sh     # about 4 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
namespace=accordion_cpu_$$
ip netns add "$namespace"
trap 'ip netns del "$namespace" 2>/dev/null || true' EXIT
ip netns exec "$namespace" ip link set lo up
ip netns exec "$namespace" tc qdisc add dev lo root tbf rate 100mbit burst 1mb latency 500ms
ip netns exec "$namespace" env PATH="$PWD/.venv/bin:$PATH" OMP_NUM_THREADS=1 PYTHONPATH="$PWD" \
    CPU_PER_STEP_COMMAND="bash benchmarks/slow_link_cpu.sh" TF_CPP_MIN_LOG_LEVEL=2 timeout 1200 \
    horovodrun -np 2 --gloo python benchmarks/cpu_per_step.py --link 100mbit --rounds 4 --steps 8 \
    --variants "compute only,ours powersgd r1,ours powersgd r1 one bucket,ddp powersgd r1,ddp accordion hook r1" \
    --out benchmarks/results/cpu_per_step_100mbit.json | sed -n 's/^\[0\]<stdout>://p'
