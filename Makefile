# Two commands do all set-up on a fresh machine:
#   make demo   the main job (posenc compare: train short, test long), into runs/compare
#   make test   the test suite
# Both create (or reuse) a local virtual environment in .venv. torch is pinned to 2.13.0 here, the
# CPU build; the package itself accepts torch>=2.4.

VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.posenc-installed

.PHONY: install demo tour test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q "$(TORCH_PIN)" -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/posenc compare --out runs/compare

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
