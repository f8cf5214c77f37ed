# One place for every routine task; CI calls the same targets.
PYTHON ?= python3
VENV ?= .venv
# The default install has no torch: knowledge search ranks by full text in the database.
# `make install-embeddings` adds the embeddings extra (hybrid search) with the CPU build of
# torch, installed first, or pip takes a CUDA build of several GB to satisfy it. From
# PyPI alone that is the pinned version's CPU wheel where one is at hand (this project's CI
# machine has it); with PyTorch's index: TORCH=torch TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EMBEDDINGS_STAMP := $(VENV)/.installed-embeddings

.PHONY: install install-embeddings run test test-postgresql lint format typecheck check bench docs

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install-embeddings: $(EMBEDDINGS_STAMP)  ## the embeddings extra: hybrid knowledge search

$(EMBEDDINGS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet $(if $(TORCH_INDEX),--index-url '$(TORCH_INDEX)') '$(TORCH)'
	$(BIN)/python -m pip install --quiet -e '.[dev,embeddings]'
	touch $(EMBEDDINGS_STAMP)

run: install  ## the server on :3000 with the offline model and the demo agent
	$(BIN)/agentstream serve --demo

test: install
	$(BIN)/pytest

test-postgresql: install  ## every server of the suite on a PostgreSQL database of its own
	AGENTSTREAM_TEST_STORE=postgresql $(BIN)/pytest

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

bench: install-embeddings  ## every scenario beside its baseline; writes docs/benchmarks.{md,json}
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python -m bench
