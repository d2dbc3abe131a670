# The two commands of the README. Both run the idempotent setup first.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
NP ?= 2

.PHONY: setup demo test check test-gpu image test-image

setup:
	VENV=$(VENV) bash scripts/setup.sh

demo: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/horovodrun -np $(NP) --gloo $(PYTHON) examples/pytorch_demo.py

# Every check; the summary lists the 25 slowest tests and each worker launch's start-up.
test: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(PYTHON) -m pytest -v --durations=25 tests

# The edit-run loop: the unit tests and one launch per backend (the tests marked `check`).
check: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(PYTHON) -m pytest -q --durations=10 -m "not multiworker or check" tests

# NCCL on two GPUs: run it in the GPU image (docker/Dockerfile.gpu), or after
# HOROVOD_GPU_OPERATIONS=NCCL with the CUDA builds it names. Skips, saying why, without them.
test-gpu: setup
	HOROVOD_ACCORDION_GPU_TESTS=1 PATH=$(abspath $(VENV))/bin:$$PATH $(PYTHON) -m pytest -v -rs tests/test_gpu.py

# The CPU image (docker/Dockerfile.cpu): `docker build` where a Docker engine runs, else buildah
# (vfs, chroot isolation) with the host's Horovod wheel cache mounted. See docker/README.md.
IMAGE ?= horovod_accordion:cpu

image:
	IMAGE=$(IMAGE) bash scripts/build_image.sh

# Runs the built image: --check-build, the demo, and horovodrun and mpirun across two containers
# as two hosts, compared with the same run outside the containers (hence setup). Needs root.
test-image: setup
	IMAGE=$(IMAGE) VENV=$(VENV) bash scripts/test_image.sh
