# Common tasks. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: help install train test test-fast lint format clean slurm-up slurm-down report bench

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python ## create .venv and install the project with its dev tools
	$(BIN)/pip install -e '.[dev]'

train: ## train with the default config (pass overrides as ARGS="experiment=fast ...")
	$(BIN)/python train.py $(ARGS)

# Two workers, one per core of a small machine (the suite keeps the CPUs busy; tests/conftest.py hands out
# the slow tests first). WORKERS=0 runs everything in this process.
WORKERS ?= 2
# A .venv made before pytest-xdist was a dev dependency runs in one process (`make install` adds it).
PARALLEL = $(shell $(BIN)/python -c "import xdist" 2>/dev/null && echo "-n $(WORKERS)")

test: ## the whole test suite, slow tests included (what CI runs)
	$(BIN)/python -m pytest -ra $(PARALLEL) $(ARGS)

test-fast: ## the quick tests only
	$(BIN)/python -m pytest -ra $(PARALLEL) -m "not slow" $(ARGS)

lint: ## ruff check, format check, the import contract (layers, no cycles) and mypy (pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

format: ## apply ruff's formatting and safe fixes
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean: ## remove run outputs and caches (not the data, not .venv)
	rm -rf outputs multirun lightning_logs .pytest_cache .ruff_cache .mypy_cache

slurm-up: ## start a local SLURM cluster (root, Debian/Ubuntu; idempotent); NODES=2 adds 2 nodes, partition multi
	NODES=$(or $(NODES),1) bash scripts/slurm_up.sh

slurm-down: ## stop the daemons slurm-up started, remove its namespaced nodes
	bash scripts/slurm_down.sh

report: ## table and plots of a sweep: make report SWEEP=multirun/<date>/<time>
	$(BIN)/python -m hydralight.report $(SWEEP)

# CORE_PYTHON=<python of an environment holding the project alone> adds the install rows (extras' start-up cost).
bench: ## benchmark suite on the real MNIST in DATA_DIR; writes benchmarks/RESULTS.md and results.png
	$(BIN)/python scripts/benchmark.py $(if $(CORE_PYTHON),--core-python $(CORE_PYTHON))
