# The two commands of the README. Both run the idempotent setup first.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
NP ?= 2

.PHONY: setup demo test test-gpu

setup:
	VENV=$(VENV) bash scripts/setup.sh

demo: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/horovodrun -np $(NP) --gloo $(PYTHON) examples/pytorch_demo.py

test: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(PYTHON) -m pytest -v tests

# NCCL on two GPUs: run it in the GPU image (docker/Dockerfile.gpu), or after
# HOROVOD_GPU_OPERATIONS=NCCL with the CUDA builds it names. Skips, saying why, without them.
test-gpu: setup
	HOROVOD_ACCORDION_GPU_TESTS=1 PATH=$(abspath $(VENV))/bin:$$PATH $(PYTHON) -m pytest -v -rs tests/test_gpu.py
