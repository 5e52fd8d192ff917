# AttnFuse: `make demo` and `make test` set up .venv on first use, then run.
#
# Setup is idempotent: it re-runs only when pyproject.toml or this file changes
# (stamp file). The `hf` extra (transformers) is installed so the Hugging Face backend's
# tests run (about 11 s of pip on the CI machine). numpy is installed because the Triton
# interpreter (TRITON_INTERPRET=1, how kernels run without a GPU) imports it but triton
# does not declare it.
# Variables: PYTHON (interpreter that creates the venv, >= 3.11), VENV (its path),
# TORCH_PIP_ARGS (extra pip arguments for torch, e.g. a CPU wheel index:
# TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu").

PYTHON ?= python3
VENV ?= .venv
TORCH_PIP_ARGS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.attnfuse-setup-stamp

.PHONY: demo test fuzz fuzz-driver setup clean-setup

demo: $(STAMP)
	$(PY) -m attnfuse.demo

# pytest exits 5 when no test is collected: that is not a failure.
# The suite runs in PYTEST_WORKERS processes (pytest-xdist): by default one per CPU, at
# most 8 (PYTEST_WORKERS=0 runs it in this process). `--dist loadgroup` hands out single
# tests, except that a module listed in tests/conftest.py's ONE_WORKER (an expensive
# module-scoped fixture: the torchrun ring runs, the sm_90 compiles) goes to one worker.
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ "$$n" -gt 8 ] && n=8; echo $$n)
PYTEST_ARGS ?=
test: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then exit 0; else exit $$rc; fi

# A longer driver fuzz run than CI's (tests/test_driver_fuzz.py): 30000 cases, a few minutes.
fuzz-driver: $(STAMP)
	ATTNFUSE_DRIVER_FUZZ_CASES=$${ATTNFUSE_DRIVER_FUZZ_CASES:-30000} $(PY) -m pytest -q -s tests/test_driver_fuzz.py

# The differential fuzzer (tests/fuzz/differential.py), longer than its CI run:
# make fuzz SEED=7 COUNT=500. Kernels run in the Triton interpreter on the CPU.
SEED ?= 1
COUNT ?= 100
fuzz: $(STAMP)
	TRITON_INTERPRET=1 $(PY) tests/fuzz/differential.py --seed $(SEED) --count $(COUNT)

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml Makefile | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install torch==2.13.0 $(TORCH_PIP_ARGS)
	$(PY) -m pip install -e '.[test,hf]' triton==3.6.0 numpy
	touch $@

clean-setup:
	rm -f $(STAMP)
