#!/usr/bin/env bash
# `make image` and `make image-gpu`: build $DOCKERFILE (docker/Dockerfile.cpu by default) as $IMAGE.
# - With a running Docker engine: `docker build`. Docker has no build-time volumes, so Horovod's
#   wheel is built inside the image (in /opt/cache) unless that layer is cached.
# - Otherwise: buildah (installed from Debian if missing), vfs storage, chroot isolation, and the
#   host's Horovod wheel cache ($HOROVOD_ACCORDION_CACHE, default ~/.cache/horovod_accordion)
#   mounted on the image's /opt/cache, so the Horovod installer (python -m horovod_accordion.tools.install_horovod) reuses or fills it, as in
#   `make setup`. Where python:3.11-slim-bookworm can't be pulled, the base is the local stand-in
#   that scripts/local_base_image.sh builds.
# Variables: IMAGE, DOCKERFILE, BASE_IMAGE (default: the Dockerfile's), HOROVOD_ACCORDION_CACHE,
# PIP_FIND_LINKS (a local wheel folder) and PIP_CERT (a CA bundle, for a TLS-inspecting proxy):
# mounted read-only and used by pip in the build.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-horovod_accordion:cpu}
DOCKERFILE=${DOCKERFILE:-docker/Dockerfile.cpu}
OFFICIAL_BASE=$(sed -n 's/^ARG BASE_IMAGE=//p' "$DOCKERFILE")
CACHE=${HOROVOD_ACCORDION_CACHE:-$HOME/.cache/horovod_accordion}
TORCH_CPU_INDEX=$(sed -n 's/^ARG PIP_EXTRA_INDEX_URL=//p' "$DOCKERFILE")

step() { echo "==> image: $*"; }
start=$SECONDS

if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    step "docker build -t $IMAGE"
    docker build -f "$DOCKERFILE" ${BASE_IMAGE:+--build-arg BASE_IMAGE="$BASE_IMAGE"} -t "$IMAGE" .
    step "built $IMAGE in $((SECONDS - start)) s"
    exit 0
fi

export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
if ! command -v buildah >/dev/null; then
    step "no Docker engine: installing buildah from Debian"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >/dev/null
fi

if [ -z "${BASE_IMAGE:-}" ]; then
    if buildah inspect --type image "$OFFICIAL_BASE" >/dev/null 2>&1 \
       || timeout 120 buildah pull --quiet "docker.io/library/$OFFICIAL_BASE" >/dev/null 2>&1; then
        BASE_IMAGE=$OFFICIAL_BASE
    else
        step "$OFFICIAL_BASE can't be pulled here: using the local stand-in (scripts/local_base_image.sh)"
        BASE_IMAGE=${LOCAL_BASE_IMAGE:-localhost/horovod_accordion-base:bookworm-py3.11}
        LOCAL_BASE_IMAGE=$BASE_IMAGE bash scripts/local_base_image.sh
    fi
fi

args=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
mkdir -p "$CACHE"
volumes=(-v "$CACHE:/opt/cache")
if [ -n "${PIP_FIND_LINKS:-}" ] && [ -d "$PIP_FIND_LINKS" ]; then
    step "pip also takes wheels from $PIP_FIND_LINKS (mounted read-only)"
    volumes+=(-v "$PIP_FIND_LINKS:/opt/wheels:ro")
    args+=(--build-arg PIP_FIND_LINKS=/opt/wheels)
    # Without the torch CPU index pip would retry it for every package: skip it when it can't be
    # reached and the local wheels have to hold the CPU torch instead.
    if [ -n "$TORCH_CPU_INDEX" ] && ! timeout 20 python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=15)" \
            "$TORCH_CPU_INDEX/torch/" >/dev/null 2>&1; then
        step "$TORCH_CPU_INDEX can't be reached: the CPU torch must come from $PIP_FIND_LINKS"
        args+=(--build-arg PIP_EXTRA_INDEX_URL=)
    fi
fi

ca=${PIP_CERT:-${SSL_CERT_FILE:-${REQUESTS_CA_BUNDLE:-}}}
if [ -n "$ca" ] && [ -f "$ca" ]; then
    step "pip in the build trusts this host's CA bundle $ca (mounted read-only)"
    volumes+=(-v "$ca:/opt/host-ca.pem:ro")
    args+=(--build-arg PIP_CERT=/opt/host-ca.pem)
fi

step "buildah bud --isolation chroot ($STORAGE_DRIVER) on $BASE_IMAGE, wheel cache $CACHE"
buildah bud --isolation chroot --layers=false "${args[@]}" "${volumes[@]}" \
    -f "$DOCKERFILE" -t "$IMAGE" .
step "built $IMAGE in $((SECONDS - start)) s: $(buildah images --format '{{.Size}}' "$IMAGE")"
