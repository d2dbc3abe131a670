#!/usr/bin/env bash
# ResNet-18 (CIFAR shapes), batch 16 per rank, 2 Gloo ranks with 1 thread each: ours, stock
# Horovod and torch DDP with its hooks, on three links. Each link is the loopback of a network
# namespace of its own, limited by tbf (shared by both ranks), as in slow_link.sh; needs root
# and iproute2. Per link, one job times ours (all variants interleaved, with stock Horovod and
# compute only), then one DDP's allreduce and fp16 hook, then one DDP's PowerSGD hooks, torch's
# and Accordion's (horovod_accordion.ddp). Writes benchmarks/results/speed_resnet18.json; on the
# unlimited link it also times the TF tape against Horovod's (speed_tf_resnet50.json).
#   bash benchmarks/speed.sh                # about 30 minutes on 2 cores
#   bash benchmarks/speed.sh ddp-powersgd   # re-time only these groups (ours, ddp, ddp-powersgd) on
#                                           # every link, into the existing results; no TF
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results/speed_resnet18.json
groups=("$@")
full_run=no
if [ ${#groups[@]} -eq 0 ]; then
    groups=(ours ddp ddp-powersgd)
    full_run=yes
    rm -f "$out"
fi
command="bash benchmarks/speed.sh${*:+ $*}"
in_namespace() {  # namespace, command...: on 2 ranks, rank 0's output
    local namespace=$1
    shift
    ip netns exec "$namespace" env PATH="$PWD/.venv/bin:$PATH" OMP_NUM_THREADS=1 PYTHONPATH="$PWD" \
        TF_CPP_MIN_LOG_LEVEL=2 timeout 1800 horovodrun -np 2 --gloo "$@" | sed -n 's/^\[0\]<stdout>://p'
}
run_link() {  # name, tbf rate or "none", rate in Mbit/s for the wire bound
    local link=$1 rate=$2 mbit=$3 namespace=accordion_speed_$$
    ip netns add "$namespace"
    trap 'ip netns del "$namespace" 2>/dev/null || true' RETURN
    ip netns exec "$namespace" ip link set lo up
    if [ "$rate" != none ]; then
        # A burst larger than one 64 KiB loopback packet, or tbf drops them all and Gloo hangs.
        ip netns exec "$namespace" tc qdisc add dev lo root tbf rate "$rate" burst 1mb latency 500ms
    fi
    for group in "${groups[@]}"; do
        in_namespace "$namespace" python benchmarks/speed.py --link "$link" --group "$group" \
            ${mbit:+--rate-mbit "$mbit"} --out "$out" --command "$command"
    done
    if [ "$link" = none ] && [ "$full_run" = yes ]; then
        in_namespace "$namespace" python benchmarks/tf_speed.py --out benchmarks/results/speed_tf_resnet50.json \
            --command "bash benchmarks/speed.sh"
    fi
}
run_link none none ""
run_link 1gbit 1gbit 1000
run_link 100mbit 100mbit 100
echo "wrote $out"
