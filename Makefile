# The two commands of the README. Both run the idempotent setup first.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
NP ?= 2

.PHONY: setup demo test check test-gpu gpu-check image test-image image-gpu test-image-gpu

setup:
	VENV=$(VENV) bash scripts/setup.sh

demo: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/horovodrun -np $(NP) --gloo $(PYTHON) examples/pytorch_demo.py

# Every check, on two pytest workers (a test file stays on one, so its launches are shared; the
# longest files first, tests/conftest.py): much of a launch is start-up and waiting, which the
# other worker's launches fill. The summary lists each test file's time, the 25
# slowest tests and each worker launch's start-up apart from its checks.
test: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(PYTHON) -m pytest -v -n 2 --dist loadfile --no-loadscope-reorder --durations=25 tests

# The edit-run loop: the unit tests and one launch per backend (the getting-started scripts, marked
# `check`), on two pytest workers; not the wheel's installs (marked `release`).
check: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(PYTHON) -m pytest -q -n 2 --dist loadfile --durations=10 -m "check or not (multiworker or release)" tests

# NCCL on two GPUs: run it in the GPU image (docker/Dockerfile.gpu), or after
# HOROVOD_GPU_OPERATIONS=NCCL with the CUDA builds it names. Skips, saying why, without them.
test-gpu: setup
	HOROVOD_ACCORDION_GPU_TESTS=1 PATH=$(abspath $(VENV))/bin:$$PATH $(PYTHON) -m pytest -v -rs tests/test_gpu.py

# On a lent GPU machine, with its own torch and no network: Horovod built with NCCL, then
# test-gpu's checks, as one JSON report naming the device (scripts/gpu_check.py says how).
GPU_CHECK_PYTHON ?= python3
gpu-check:
	$(GPU_CHECK_PYTHON) scripts/gpu_check.py --require-gpu

# The CPU image (docker/Dockerfile.cpu): `docker build` where a Docker engine runs, else buildah
# (vfs, chroot isolation) with the host's Horovod wheel cache mounted. See docker/README.md.
IMAGE ?= horovod_accordion:cpu

image:
	IMAGE=$(IMAGE) bash scripts/build_image.sh

# Runs the built image: --check-build, the demo, and horovodrun and mpirun across two containers
# as two hosts, compared with the same run outside the containers (hence setup). Needs root.
test-image: setup
	IMAGE=$(IMAGE) VENV=$(VENV) bash scripts/test_image.sh

# The GPU image (docker/Dockerfile.gpu): the package index's CUDA builds of torch and TF, and
# Horovod built with NCCL against CUDA wheels; no CUDA base image, so it builds here. A local
# wheelhouse ($PIP_FIND_LINKS) is the CPU image's: it would hand pip the CPU torch.
GPU_IMAGE ?= horovod_accordion:gpu

image-gpu:
	PIP_FIND_LINKS= IMAGE=$(GPU_IMAGE) DOCKERFILE=docker/Dockerfile.gpu bash scripts/build_image.sh

# test-image's runs, in the GPU image and without a GPU, and also: --check-build lists NCCL, and
# each framework's Horovod extension loads with NCCL, on the environment's libnccl.so.2.
test-image-gpu: setup
	IMAGE=$(GPU_IMAGE) VENV=$(VENV) FEATURES="TensorFlow PyTorch MPI Gloo NCCL" bash scripts/test_image.sh
