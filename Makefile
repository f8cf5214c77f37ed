# One place for every routine task; CI calls the same targets.
PYTHON ?= python3
VENV ?= .venv
# Knowledge bases embed with sentence-transformers on torch: install the CPU build first,
# or pip takes a CUDA build of several GB to satisfy it.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint format typecheck check bench docs

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet '$(TORCH)'
	$(BIN)/python -m pip install --quiet -e '.[dev,knowledge]'
	touch $(STAMP)

run: install  ## the server on :3000 with the offline model and the demo agent
	$(BIN)/agentstream serve --demo

test: install
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format: install
	$(BIN)/ruff check --fix src tests bench
	$(BIN)/ruff format src tests bench

typecheck: install
	$(BIN)/mypy

check: lint typecheck test

docs: install  ## regenerate docs/models.md from the model registry
	$(BIN)/python -m agentstream.providers.catalog > docs/models.md

bench: install  ## every scenario beside its baseline; writes docs/benchmarks.{md,json}
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python -m bench
