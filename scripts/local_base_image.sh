#!/usr/bin/env bash
# Build a local stand-in for python:3.11-slim-bookworm where no registry can be reached:
# Debian 12 from debootstrap (minbase), Debian's Python 3.11 with venv and headers, committed
# with buildah as $LOCAL_BASE_IMAGE. `make image` calls it when the official base can't be pulled.
#
#   scripts/local_base_image.sh            # builds localhost/horovod_accordion-base:bookworm-py3.11
#   FORCE=1 scripts/local_base_image.sh    # rebuild even if that image exists
#
# Differences from the official image (docker/README.md has the table): Python is Debian's
# 3.11.2 in /usr/bin (the official one is a source build of the latest 3.11.x in /usr/local/bin),
# and its headers and venv come from Debian's python3-dev and python3-venv packages.
set -euo pipefail

NAME=${LOCAL_BASE_IMAGE:-localhost/horovod_accordion-base:bookworm-py3.11}
SUITE=bookworm
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
# The Debian mirror apt already uses here, else deb.debian.org.
MIRROR=${DEBIAN_MIRROR:-$(grep -hoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' \
    /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null | grep -oE 'https?://[^ ]+' | head -1 || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
# What the official image has and our setup needs, in Debian's packages: python3 with venv
# (ensurepip) and the headers (Horovod and mpi4py compile against them), CA certificates for
# pip, netbase (/etc/services, /etc/protocols), and `python` as a name for python3.
PACKAGES=python3,python3-venv,python3-dev,python-is-python3,ca-certificates,netbase,tzdata

step() { echo "==> local_base_image: $*"; }

if [ -z "${FORCE:-}" ] && buildah inspect --type image "$NAME" >/dev/null 2>&1; then
    step "$NAME already exists (FORCE=1 rebuilds it)"
    exit 0
fi
for tool in debootstrap buildah; do
    if ! command -v "$tool" >/dev/null; then
        step "installing $tool from Debian"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$tool" >/dev/null
    fi
done

root=$(mktemp -d /var/tmp/horovod_accordion-base.XXXXXX)
ctr=""
unmount_all() {  # debootstrap mounts /proc (and on some hosts /dev) in the tree: never rm through them
    local m
    for m in $(findmnt -rn -o TARGET | grep -F "$root/" | sort -r); do umount -l "$m" || true; done
    ! findmnt -rn -o TARGET | grep -qF "$root/"
}
cleanup() {
    [ -n "$ctr" ] && buildah rm "$ctr" >/dev/null 2>&1 || true
    if unmount_all; then rm -rf "$root"; else echo "local_base_image: $root still has mounts; left it" >&2; fi
}
trap cleanup EXIT

step "debootstrap --variant=minbase $SUITE from $MIRROR (about 4 minutes)"
start=$SECONDS
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >/dev/null
step "debootstrap took $((SECONDS - start)) s"

# The official image's apt sources: the release, its updates and the security archive.
rm -f "$root/etc/apt/sources.list"
cat > "$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${MIRROR%/debian*}/debian-security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
unmount_all
# Like Debian's official images: no apt caches or logs, no device nodes (the runtime provides /dev).
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
       "$root"/var/log/*.log "$root"/dev/* "$root"/proc/* "$root"/sys/* "$root"/run/*
chroot "$root" python3 -c 'import sys, ensurepip, venv; print("python", sys.version.split()[0])'

step "committing $NAME with buildah ($STORAGE_DRIVER storage)"
ctr=$(buildah from scratch)
mnt=$(buildah mount "$ctr")
cp -a "$root/." "$mnt/"
buildah umount "$ctr" >/dev/null
# The official image's config, except that Python lives in /usr/bin.
buildah config --env LANG=C.UTF-8 \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd python3 --os linux --arch "$(dpkg --print-architecture)" \
    --label org.opencontainers.image.description="local stand-in for python:3.11-slim-bookworm (debootstrap $SUITE + Debian python3)" \
    "$ctr"
buildah commit --quiet --rm "$ctr" "$NAME" >/dev/null
ctr=""
step "built $NAME: $(buildah images --format '{{.Size}}' "$NAME")"
