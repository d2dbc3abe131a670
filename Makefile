# The two commands of the README. Both run the idempotent setup first.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
NP ?= 2

.PHONY: setup demo test

setup:
	VENV=$(VENV) bash scripts/setup.sh

demo: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/horovodrun -np $(NP) --gloo $(PYTHON) examples/pytorch_demo.py

test: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(PYTHON) -m pytest -v tests
