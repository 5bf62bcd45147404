# Two entry points for a fresh clone: `make demo` and `make test`.
# Each creates .venv (if missing) and installs the package into it first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first: a plain `torch` requirement would fetch a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0 || $(BIN)/pip install -q 'torch>=2.3' --index-url https://download.pytorch.org/whl/cpu
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m llm.demo

test: $(STAMP)
	$(BIN)/python -m pytest tests

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/pip install -q --no-deps litdata  # see pyproject.toml: keeps the CPU torch
	$(BIN)/python -m bench
