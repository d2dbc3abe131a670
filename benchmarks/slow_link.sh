#!/usr/bin/env bash
# Step time per compression over a rate-limited link: both Gloo ranks share a loopback
# limited by tbf in a network namespace (needs root and iproute2). Default 100 Mbit/s.
#   bash benchmarks/slow_link.sh [RATE]      -> benchmarks/results/torch_slow_link_<RATE>.json
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-100mbit}
namespace=accordion_bench_$$
ip netns add "$namespace"
trap 'ip netns del "$namespace"' EXIT
ip netns exec "$namespace" ip link set lo up
# A burst larger than one 64 KiB loopback packet, or tbf drops them all and Gloo hangs.
ip netns exec "$namespace" tc qdisc add dev lo root tbf rate "$rate" burst 1mb latency 500ms
ip netns exec "$namespace" env PATH="$PWD/.venv/bin:$PATH" OMP_NUM_THREADS=1 \
    timeout 900 horovodrun -np 2 --gloo python benchmarks/torch_step_cost.py \
    --width 1024 --depth 2 --steps 5 --rounds 3 --link "loopback limited to $rate by tbf (shared by both ranks)" \
    --out "benchmarks/results/torch_slow_link_$rate.json" | sed -n 's/^\[0\]<stdout>://p'
