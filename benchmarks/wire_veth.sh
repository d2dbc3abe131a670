#!/usr/bin/env bash
# Accordion's wire-byte count against the kernel's: 2 ranks, each in its own network namespace,
# joined by a veth pair limited to 1 Gbit/s by tbf; DDP with Accordion's hook (wire_veth.py).
# Needs root and iproute2.
#   bash benchmarks/wire_veth.sh    -> benchmarks/results/wire_veth.json
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results/wire_veth.json
a=accordion_wire_a_$$ b=accordion_wire_b_$$
ip netns add "$a"
ip netns add "$b"
trap "ip netns del $a 2>/dev/null || true; ip netns del $b 2>/dev/null || true" EXIT
ip link add "wire-a$$" type veth peer name "wire-b$$"
ip link set "wire-a$$" netns "$a"
ip link set "wire-b$$" netns "$b"
ip netns exec "$a" ip addr add 10.78.0.1/24 dev "wire-a$$"
ip netns exec "$b" ip addr add 10.78.0.2/24 dev "wire-b$$"
pids=()
node=0
for side in a b; do
    namespace=${!side}
    device=wire-$side$$
    ip netns exec "$namespace" ip link set lo up
    ip netns exec "$namespace" ip link set "$device" up
    ip netns exec "$namespace" tc qdisc add dev "$device" root tbf rate 1gbit burst 1mb latency 500ms
    ip netns exec "$namespace" env PATH="$PWD/.venv/bin:$PATH" OMP_NUM_THREADS=1 PYTHONPATH="$PWD" \
        GLOO_SOCKET_IFNAME="$device" timeout 900 python -m torch.distributed.run --nnodes 2 \
        --node_rank "$node" --nproc_per_node 1 --master_addr 10.78.0.1 --master_port 29611 \
        benchmarks/wire_veth.py --veth "$device" --out "$out" --command "bash benchmarks/wire_veth.sh" &
    pids+=($!)
    node=$((node + 1))
done
for pid in "${pids[@]}"; do wait "$pid"; done
echo "wrote $out"
