# Two entry points (see README): `make verify` (the main job) and `make test` (every check).
# Both create .venv and install kvpool into it. Without CUDA, torch is pinned to the CPU build
# on disk (constraints-cpu.txt) so that pip does not pull a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.kvpool-installed
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1)
CONSTRAINTS := $(if $(HAS_CUDA),,-c constraints-cpu.txt)
XDIST  ?= -n 2

.PHONY: install test test-fast lint typecheck pytest verify bench clean

$(STAMP): pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(CONSTRAINTS) -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(BIN)/ruff check kvpool tests benchmarks
	$(BIN)/ruff format --check kvpool tests benchmarks

typecheck: install
	$(BIN)/mypy --strict

pytest: install
	HYPOTHESIS_PROFILE=ci $(BIN)/pytest -q $(XDIST)

test: lint typecheck pytest

# The edit loop: every test not marked slow (tests/README.md), under a minute on 2 cores.
# `make test` stays the full gate.
test-fast: install
	HYPOTHESIS_PROFILE=ci $(BIN)/pytest -q $(XDIST) -m "not slow"

verify: install
	$(BIN)/kvpool verify

bench: install
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
