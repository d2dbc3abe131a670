#!/usr/bin/env bash
# `make test-image`: run the built CPU image ($IMAGE) for real, without a Docker engine.
#  1. `horovodrun --check-build` in the image lists TensorFlow, PyTorch, MPI and Gloo.
#  2. The image's default command (the demo) runs and reports Accordion's bytes.
#  3. Two containers as two hosts, docker/README.md's multi-node recipe: each is the image's own
#     root file system (a buildah container, mounted) in its own network, mount, PID, UTS and IPC
#     namespaces, joined by a veth pair: host-a is 10.199.0.2 and host-b 10.199.0.3 on eth0. Each
#     runs sshd on port 2222 with a test key made here and copied into both containers.
#     From host-a, `horovodrun --gloo -np 2 -H 10.199.0.2:1,10.199.0.3:1 -p 2222` and then
#     `mpirun` across the two train the torch example with Accordion (docker/two_hosts_probe.py).
#     The ranks must run on different hosts with identical levels and final parameters, and each
#     run's bytes per step must equal those of the same run outside the containers ($VENV).
# Everything it starts is stopped and removed on exit. Needs root (namespaces, chroot).
# FEATURES: what --check-build must list. Where it lists NCCL (`make test-image-gpu`), each
# framework's Horovod extension must also load with NCCL built, and torch's NCCL and cuDNN wheels
# own their files.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-horovod_accordion:cpu}
VENV=${VENV:-.venv}
EPOCHS=${EPOCHS:-8}
FEATURES=${FEATURES:-TensorFlow PyTorch MPI Gloo}
PROBE=(python docker/two_hosts_probe.py --epochs "$EPOCHS")
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
tag=hvdtest$$
work=$(mktemp -d /tmp/horovod_accordion-test-image.XXXXXX)
declare -A ADDR=([a]=10.199.0.2 [b]=10.199.0.3) CTR=() ROOT=() SSHD=()

step() { echo "==> test-image [$((SECONDS))s]: $*"; }
fail() { echo "test-image: FAILED: $*" >&2; exit 1; }

quiet() {  # the runs' output without progress bars, TF's start-up notes and the PROBE JSON
    tr '\r' '\n' | sed -E -e 's/(\[[0-9,]+\]<std(out|err)>:)+/\1/g' \
        -e 's/PROBE \{.*"host": "([^"]*)".*"rank": ([0-9]+).*/PROBE of rank \2 on \1 (its JSON is compared below)/' \
        | grep -Ev 'epoch/s|it/s\]|s/it\]|(I0000|WARNING: All log|To enable the following)|^(\[[0-9,]+\]<std(out|err)>:)?\s*$' || true
}
traffic() {  # bytes through host-a's eth0, the link between the two hosts, since the last call
    local rx tx
    rx=$(ip netns exec "$tag-a" cat /sys/class/net/eth0/statistics/rx_bytes)
    tx=$(ip netns exec "$tag-a" cat /sys/class/net/eth0/statistics/tx_bytes)
    TRAFFIC="host-a's eth0 sent $(( (tx - ${LAST_TX:-0}) / 1000 )) kB and received $(( (rx - ${LAST_RX:-0}) / 1000 )) kB"
    LAST_TX=$tx LAST_RX=$rx
}
cleanup() {
    set +e
    # unshare ignores SIGTERM while it waits for its child: SIGKILL it, and --kill-child takes the host down
    for h in "${!SSHD[@]}"; do kill -KILL "${SSHD[$h]}" 2>/dev/null; wait "${SSHD[$h]}" 2>/dev/null; done
    for h in "${!CTR[@]}"; do buildah umount "${CTR[$h]}" >/dev/null 2>&1; buildah rm "${CTR[$h]}" >/dev/null 2>&1; done
    for h in a b; do ip netns del "$tag-$h" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT

if ! buildah inspect --type image "$IMAGE" >/dev/null 2>&1; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        step "copying $IMAGE from the Docker engine into buildah's storage"
        buildah pull "docker-daemon:$IMAGE" >/dev/null
    else
        fail "no image $IMAGE: run make image first"
    fi
fi
mapfile -t IMAGE_ENV < <(buildah inspect --type image --format '{{range .OCIv1.Config.Env}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')
WORKDIR=$(buildah inspect --type image --format '{{.OCIv1.Config.WorkingDir}}' "$IMAGE")

# Horovod's Gloo init segfaults where the host name doesn't resolve. Docker and podman put the
# container's name in its /etc/hosts; `buildah run` doesn't, so steps 1 and 2 name it.
for h in a b; do
    CTR[$h]=$(buildah from --name "$tag-$h" --add-host "host-$h:127.0.0.1" "$IMAGE")
done
RUN_A=(buildah run --isolation chroot --hostname host-a "${CTR[a]}" --)

# 1. The build.
step "horovodrun --check-build"
check=$("${RUN_A[@]}" horovodrun --check-build)
quiet <<<"$check"
for feature in $FEATURES; do
    grep -Eq "\[X\] $feature\$" <<<"$check" || fail "--check-build does not list $feature"
done

# 2. The default command: the demo.
mapfile -t CMD < <(buildah inspect --type image --format '{{range .OCIv1.Config.Cmd}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')
step "the image's default command: ${CMD[*]}"
started=$SECONDS
"${RUN_A[@]}" "${CMD[@]}" 2>&1 | tee "$work/demo.log" | quiet || true
grep -q "^\[rank 0\] accordion: test accuracy" <(sed -E 's/^\[[0-9,]+\]<stdout>://' "$work/demo.log") \
    || fail "the demo did not report Accordion's result"
step "demo passed in $((SECONDS - started)) s"

if [[ " $FEATURES " == *" NCCL "* ]]; then
    step "torch's NCCL and cuDNN wheels own their files (TensorFlow's CUDA 12 ones share the paths)"
    "${RUN_A[@]}" python -c "from horovod_accordion.tools import cuda_toolkit as c
assert c.overwritten_pins() == [], c.overwritten_pins()" || fail "TensorFlow's CUDA wheels overwrote torch's"
    # A process per framework, as a user's job: each loads Horovod's extension, built with NCCL,
    # and the one libnccl.so.2 of the environment (not the build's folder, which the image lacks).
    for framework in torch tensorflow; do
        step "horovod.$framework loads, built with NCCL, with the environment's libnccl.so.2"
        "${RUN_A[@]}" python -c "import $framework, horovod.$framework as hvd
assert hvd.nccl_built() and hvd.cuda_built(), 'horovod.$framework: no NCCL or CUDA in the build'
[nccl] = {line.split()[-1] for line in open('/proc/self/maps') if 'libnccl.so' in line}
assert nccl.endswith('site-packages/nvidia/nccl/lib/libnccl.so.2'), nccl
print('horovod.$framework: NCCL', hvd.nccl_built(), 'from', nccl)" 2>&1 | quiet \
            || fail "horovod.$framework did not load with NCCL"
    done
fi

# 3. Two hosts.
ssh-keygen -q -t ed25519 -N "" -C "horovod_accordion test-image" -f "$work/id_ed25519"
hosts=""
for h in a b; do hosts+="${ADDR[$h]} host-$h"$'\n'; done
for h in a b; do
    ROOT[$h]=$(buildah mount "${CTR[$h]}")
    r=${ROOT[$h]}
    install -d -m 700 "$r/root/.ssh"
    install -m 600 "$work/id_ed25519" "$r/root/.ssh/id_ed25519"
    install -m 644 "$work/id_ed25519.pub" "$r/root/.ssh/id_ed25519.pub"
    install -m 600 "$work/id_ed25519.pub" "$r/root/.ssh/authorized_keys"
    printf 'Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n' > "$r/root/.ssh/config"
    printf '127.0.0.1 localhost\n%s' "$hosts" > "$r/etc/hosts"
    echo "host-$h" > "$r/etc/hostname"
    ip netns add "$tag-$h"
    ip -n "$tag-$h" link set lo up
done
ip link add name eth0 netns "$tag-a" type veth peer name eth0 netns "$tag-b"
for h in a b; do
    ip -n "$tag-$h" addr add "${ADDR[$h]}/24" dev eth0
    ip -n "$tag-$h" link set eth0 up
done

# Each host: its own namespaces, its root file system with /proc, /sys, /dev and a private
# /dev/shm, and sshd as its first process (SIGKILL to unshare kills the whole host).
for h in a b; do
    r=${ROOT[$h]}
    ip netns exec "$tag-$h" unshare --mount --uts --ipc --pid --fork --kill-child sh -c "
        hostname host-$h
        mount -t proc proc '$r/proc'
        mount -t sysfs sysfs '$r/sys'
        mount --rbind /dev '$r/dev'
        mount -t tmpfs -o mode=1777 shm '$r/dev/shm'
        mount -t tmpfs -o mode=755 run '$r/run' && mkdir -p '$r/run/sshd'
        exec chroot '$r' /usr/sbin/sshd -D -e -p 2222 -o ListenAddress=${ADDR[$h]}
    " > "$work/sshd-$h.log" 2>&1 &
    SSHD[$h]=$!
done
sleep 2
inside_pid() {  # the first process of host $1 (its sshd)
    cat "/proc/${SSHD[$1]}/task/${SSHD[$1]}/children" | awk '{print $1}'
}
on_host() {  # run a command on host $1 as `docker exec` would: its namespaces, the image's env and workdir
    local h=$1; shift
    nsenter -t "$(inside_pid "$h")" -m -u -i -n -p -r -w \
        env -i "${IMAGE_ENV[@]}" HOME=/root bash -c "cd '$WORKDIR' && $*"
}
for h in a b; do
    [ -n "$(inside_pid "$h")" ] || { cat "$work/sshd-$h.log"; fail "sshd on host-$h did not start"; }
    on_host a "ssh -p 2222 ${ADDR[$h]} 'echo \$(hostname) reached over ssh at ${ADDR[$h]}:2222'"
done

HOSTS="${ADDR[a]}:1,${ADDR[b]}:1"
traffic
step "horovodrun --gloo -np 2 -H $HOSTS -p 2222 (from host-a)"
started=$SECONDS
on_host a "horovodrun --gloo -np 2 -H $HOSTS -p 2222 ${PROBE[*]}" 2>&1 | tee "$work/horovodrun.log" | quiet
traffic
step "horovodrun across two hosts took $((SECONDS - started)) s; $TRAFFIC"

step "mpirun -np 2 -H $HOSTS over ssh port 2222 (from host-a)"
started=$SECONDS
on_host a "mpirun -np 2 -H $HOSTS --mca plm_rsh_args '-p 2222' --mca btl self,tcp --mca btl_tcp_if_include eth0 \
    --mca oob_tcp_if_include eth0 -x PATH -x TF_USE_LEGACY_KERAS -bind-to none -map-by slot \$(command -v python) ${PROBE[*]:1}" \
    2>&1 | tee "$work/mpirun.log" | quiet
traffic
step "mpirun across two hosts took $((SECONDS - started)) s; $TRAFFIC"

step "the same run outside the containers: $VENV/bin/horovodrun --gloo -np 2 on this machine"
started=$SECONDS
PATH="$(cd "$VENV" && pwd)/bin:$PATH" "$VENV/bin/horovodrun" --gloo -np 2 -H localhost:2 "${PROBE[@]}" \
    2>&1 | tee "$work/outside.log" | quiet
step "outside run took $((SECONDS - started)) s"

"$VENV/bin/python" - "$work/horovodrun.log" "$work/mpirun.log" "$work/outside.log" <<'PYEOF'
import json, re, sys

def probes(path):
    found = [json.loads(m) for m in re.findall(r"PROBE (\{.*\})", open(path).read())]
    return sorted(found, key=lambda p: p["rank"])

outside = probes(sys.argv[3])
assert [p["rank"] for p in outside] == [0, 1], f"outside run: ranks {[p['rank'] for p in outside]}"
failed = []
for name, path in (("horovodrun", sys.argv[1]), ("mpirun", sys.argv[2])):
    ranks = probes(path)
    if [p["rank"] for p in ranks] != [0, 1]:
        failed.append(f"{name}: PROBE lines of ranks {[p['rank'] for p in ranks]}, not [0, 1]")
        continue
    r0, r1 = ranks
    checks = {
        "ranks on two hosts": (r0["host"], r1["host"]) == ("host-a", "host-b"),
        "levels identical on both hosts": r0["check_levels"] == r1["check_levels"]
                                          and r0["final_levels"] == r1["final_levels"],
        "parameters end identical": r0["params_sha256"] == r1["params_sha256"],
        "bytes per step equal those outside": all(p["bytes_per_step"] == o["bytes_per_step"]
                                                  for p, o in zip(ranks, outside)),
    }
    same_levels = r0["check_levels"] == outside[0]["check_levels"]
    same_params = r0["params_sha256"] == outside[0]["params_sha256"]
    steps, per_step = r0["steps"], sorted(set(r0["bytes_per_step"]))
    print(f"{name}: hosts {r0['host']}, {r1['host']}; {len(r0['check_levels'])} checks, levels "
          f"{[c['levels'] for c in r0['check_levels']][-1] if r0['check_levels'] else None}; {steps} steps, "
          f"bytes per step in {per_step}, {r0['total_bytes_sent']} bytes per rank "
          f"(outside: {outside[0]['total_bytes_sent']}); params {r0['params_sha256'][:16]}; "
          f"test accuracy {r0['test_accuracy']}")
    print(f"{name}: (for information) levels as outside: {same_levels}; parameters as outside: {same_params}")
    for what, ok in checks.items():
        print(f"{name}: {'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failed.append(f"{name}: {what}")
if failed:
    sys.exit("test-image: FAILED: " + "; ".join(failed))
PYEOF
step "passed: check-build ($FEATURES), demo, two-host horovodrun and mpirun"
