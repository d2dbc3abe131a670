#!/usr/bin/env bash
# Build (or reuse) the patched Horovod wheel and install it into the given venv.
# The wheel is cached outside git, keyed by every input that changes its binary:
# Horovod, torch, TF and Python versions, the build flags and the patch script.
set -euo pipefail

HOROVOD_VERSION=0.28.1
venv=$(cd "${1:?usage: build_horovod.sh VENV_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
py="$venv/bin/python"

cache_root=${HOROVOD_ACCORDION_CACHE:-$HOME/.cache/horovod_accordion}
# HOROVOD_GPU_OPERATIONS=NCCL (the GPU image sets it) joins the flags, and so the cache key.
BUILD_FLAGS="HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1${HOROVOD_GPU_OPERATIONS:+ HOROVOD_GPU_OPERATIONS=$HOROVOD_GPU_OPERATIONS}"
key=$("$py" - "$here/patch_horovod.py" <<PYEOF
import hashlib, sys, platform, torch, tensorflow as tf
h = hashlib.sha256()
h.update(f"horovod=$HOROVOD_VERSION $BUILD_FLAGS torch={torch.__version__} tf={tf.__version__} py={platform.python_version()} {platform.machine()}".encode())
for path in sys.argv[1:]:
    h.update(open(path, "rb").read())
print(h.hexdigest()[:16])
PYEOF
)
wheel_dir="$cache_root/wheels/horovod-$HOROVOD_VERSION-$key"

if "$py" -c "import horovod, sys; sys.exit(horovod.__version__ != '$HOROVOD_VERSION')" 2>/dev/null \
   && [ -f "$venv/.horovod-key" ] && [ "$(cat "$venv/.horovod-key")" = "$key" ]; then
    echo "build_horovod: Horovod $HOROVOD_VERSION ($key) already installed in $venv"
    exit 0
fi

if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    echo "build_horovod: no cached wheel for key $key; building (about 20-25 minutes on 2 cores)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$venv/bin/pip" download --quiet --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
    tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    "$py" "$here/patch_horovod.py" "$src"
    tf_include=$("$py" -c "import tensorflow as tf; print(tf.sysconfig.get_include())")
    # CMake 4 (PyPI's cmake wheel) rejects Gloo's cmake_minimum_required: use the system 3.x.
    export PATH="/usr/bin:$PATH"
    export CPLUS_INCLUDE_PATH="$tf_include/external/highwayhash:$tf_include/external/farmhash_archive/src${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
    export $BUILD_FLAGS
    export MAKEFLAGS=${MAKEFLAGS:--j$(nproc)}
    mkdir -p "$work/wheel"
    (cd "$src" && "$venv/bin/pip" wheel --no-build-isolation --no-deps -w "$work/wheel" .)
    mkdir -p "$wheel_dir"
    mv "$work/wheel"/horovod-*.whl "$wheel_dir/"
    echo "build_horovod: cached $(ls "$wheel_dir")"
else
    echo "build_horovod: reusing cached wheel $(ls "$wheel_dir"/horovod-*.whl)"
fi

"$venv/bin/pip" install --quiet --force-reinstall "$wheel_dir"/horovod-*.whl
echo "$key" > "$venv/.horovod-key"
