#!/usr/bin/env bash
# ResNet-18 (CIFAR shapes), batch 16 per rank, 2 Gloo ranks with 1 thread each: our 8- and 4-bit
# two-shot exchange against none, fp16, PowerSGD r4 and DDP's allreduce, with compute only, all
# interleaved in one job per link (torch's quantization_pertensor_hook, a variant of speed.py, fails
# on Gloo: "invalid index of a 0-dim tensor" in its all-gather's callback), on an unlimited loopback and on one limited to
# 100 Mbit/s by tbf (shared by both ranks), as speed.sh does; needs root and iproute2.
#   bash benchmarks/quantized_speed.sh    -> benchmarks/results/speed_quantized_resnet18.json
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results/speed_quantized_resnet18.json
rm -f "$out"
variants="compute only,ours none,ours fp16,ours powersgd r4,ours quantized 8,ours quantized 4,ddp allreduce"
for link in none 100mbit; do
    namespace=accordion_quantized_$$
    ip netns add "$namespace"
    ip netns exec "$namespace" ip link set lo up
    mbit=()
    if [ "$link" != none ]; then
        ip netns exec "$namespace" tc qdisc add dev lo root tbf rate "$link" burst 1mb latency 500ms
        mbit=(--rate-mbit 100)
    fi
    ip netns exec "$namespace" env PATH="$PWD/.venv/bin:$PATH" OMP_NUM_THREADS=1 PYTHONPATH="$PWD" \
        timeout 1800 horovodrun -np 2 --gloo python benchmarks/speed.py --link "$link" "${mbit[@]}" \
        --variants "$variants" --rounds 2 --out "$out" --command "bash benchmarks/quantized_speed.sh" \
        | sed -n 's/^\[0\]<stdout>://p'
    ip netns del "$namespace"
done
