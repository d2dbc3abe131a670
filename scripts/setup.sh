#!/usr/bin/env bash
# Idempotent setup: system MPI, a venv in .venv with the pinned stack, the project in
# editable mode, and the patched Horovod wheel (cached) from the package's own installer.
# Safe to run again: each step checks whether its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
# The pinned stack. The GPU image (docker/Dockerfile.gpu) keeps these versions and swaps the
# CPU builds for CUDA ones through the *_SPEC variables and PIP_EXTRA_INDEX_URL.
TORCH=${TORCH_SPEC:-torch==2.13.0}
TENSORFLOW=${TENSORFLOW_SPEC:-tensorflow-cpu==2.21.0}
TF_KERAS=${TF_KERAS_SPEC:-tf-keras==2.21.0}

step() { echo "==> setup: $*"; }

if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null || ! [ -x /usr/bin/cmake ]; then
    step "installing Open MPI and cmake from Debian"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenmpi-dev openmpi-bin cmake >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
    step "creating $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip setuptools wheel
fi

# torch is pinned to the CPU build; unpinned, pip would fetch a multi-GB CUDA build.
if ! "$VENV/bin/python" - "$TORCH" "$TENSORFLOW" "$TF_KERAS" <<PYEOF 2>/dev/null
import importlib.metadata as m, re, sys
want = dict(re.fullmatch(r"([\w.-]+)(?:\[[\w,-]+\])?==(.+)", spec).groups() for spec in sys.argv[1:])
sys.exit(any(not m.version(k).startswith(v) for k, v in want.items()))
PYEOF
then
    step "installing $TORCH $TENSORFLOW $TF_KERAS"
    "$VENV/bin/pip" install --quiet "$TORCH" "$TENSORFLOW" "$TF_KERAS"
fi

step "installing horovod_accordion (editable, with dev extras)"
"$VENV/bin/pip" install --quiet --no-build-isolation -e ".[dev]"

# The packaged installer a wheel user runs: builds or reuses the cached patched wheel, then
# requires `horovodrun --check-build` to list TensorFlow, PyTorch, MPI and Gloo.
step "building or reusing Horovod"
"$VENV/bin/python" -m horovod_accordion.tools.install_horovod
step "ready"
