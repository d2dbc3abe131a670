#!/usr/bin/env bash
# FSDP2 hybrid sharding on two "nodes" joined by a slow link: ResNet-18, 2 replicas × 2 shards,
# native HSDP against Accordion's exchange on the shards (benchmarks/hsdp_speed.py). Each node is a
# network namespace running torchrun with 2 processes; the veth pair between them carries the
# replicas' all-reduce and is limited by tbf; each node's shard group talks over its own loopback.
# Needs root and iproute2. Default links: unlimited, then 100 Mbit/s.
#   bash benchmarks/hsdp_link.sh [RATE...]    -> benchmarks/results/hsdp_resnet18.json
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results/hsdp_resnet18.json
rates=("$@")
[ ${#rates[@]} -gt 0 ] || { rates=(none 100mbit); rm -f "$out"; }
command="bash benchmarks/hsdp_link.sh${*:+ $*}"
run_link() {  # tbf rate, or none
    local rate=$1 a=accordion_hsdp_a_$$ b=accordion_hsdp_b_$$
    ip netns add "$a"
    ip netns add "$b"
    trap "ip netns del $a 2>/dev/null || true; ip netns del $b 2>/dev/null || true" RETURN
    ip link add "hsdp-a$$" type veth peer name "hsdp-b$$"
    ip link set "hsdp-a$$" netns "$a"
    ip link set "hsdp-b$$" netns "$b"
    ip netns exec "$a" ip addr add 10.77.0.1/24 dev "hsdp-a$$"
    ip netns exec "$b" ip addr add 10.77.0.2/24 dev "hsdp-b$$"
    for side in a b; do
        local namespace=${!side} device=hsdp-$side$$
        ip netns exec "$namespace" ip link set lo up
        ip netns exec "$namespace" ip link set "$device" up
        if [ "$rate" != none ]; then
            # A burst larger than one 64 KiB packet, or tbf drops them all and Gloo hangs.
            ip netns exec "$namespace" tc qdisc add dev "$device" root tbf rate "$rate" burst 1mb latency 500ms
        fi
    done
    local port=29$((RANDOM % 900 + 100)) node=0 pids=()
    for side in a b; do
        local namespace=${!side} device=hsdp-$side$$
        ip netns exec "$namespace" env PATH="$PWD/.venv/bin:$PATH" OMP_NUM_THREADS=1 PYTHONPATH="$PWD" \
            GLOO_SOCKET_IFNAME="$device" timeout 1800 python -m torch.distributed.run --nnodes 2 \
            --node_rank "$node" --nproc_per_node 2 --master_addr 10.77.0.1 --master_port "$port" \
            benchmarks/hsdp_speed.py --link "$rate" --veth "$device" --out "$out" --command "$command" &
        pids+=($!)
        node=$((node + 1))
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
}
for rate in "${rates[@]}"; do
    run_link "$rate"
done
echo "wrote $out"
