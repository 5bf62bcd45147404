# Entry points for a fresh clone: `make demo`, `make test` (quick) and `make test-all` (everything); CI runs both
# tests and `make test-min` (the declared minimum numpy, pyarrow and torch, in a venv of its own).
# Each creates .venv (if missing) and installs the package into it first.
#   make setup TORCH=cuda     # the CUDA build of PyTorch (default TORCH=cpu: small, works everywhere)
# Switching TORCH replaces the PyTorch in .venv; `make setup` prints which build it installed.
PY ?= python3
TORCH ?= cpu
TORCH_VERSION ?= 2.13.0
# The CUDA wheel index TORCH=cuda installs from (https://download.pytorch.org/whl/<this>).
TORCH_CUDA ?= cu126
# 1: a PyTorch of the other build is installed (and is replaced); 0: none, or the wanted build.
OTHER_TORCH = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('torch') is None else int(bool(__import__('torch').version.cuda) != $(1)))"
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(TORCH)
PYTEST_ARGS := -ra --durations=10 -o console_output_style=progress
# Azurite, the Azure Blob Storage emulator the az:// tests start (npm; tests/storage/azurite.py pins the same).
# 3.35: the last release whose package accepts Node 18 (Debian 12's; engines ">=10"); 3.36+ require Node 21+. Tested on Node 20.
AZURITE_VERSION ?= 3.35.0
AZURITE := $(VENV)/azurite/node_modules/.bin/azurite-blob

.PHONY: setup azurite azurite-if-npm demo test test-all test-min lint bench

# setup.py and the C source: a changed kernel is rebuilt (pip install -e builds it into src/llm/data/ledger/)
$(STAMP): pyproject.toml setup.py src/llm/data/ledger/_rows.c
	@echo "setup: [1/4] creating $(VENV) with $(PY) (once)"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "setup: [2/4] upgrading pip"
	$(BIN)/pip install -q --upgrade pip
ifeq ($(TORCH),cuda)
	@echo "setup: [3/4] installing PyTorch $(TORCH_VERSION), CUDA build from whl/$(TORCH_CUDA) (a few GB; needs the network)"
	$(BIN)/python -c $(call OTHER_TORCH,True) || $(BIN)/pip uninstall -q -y torch
	$(BIN)/pip install -q torch==$(TORCH_VERSION) --index-url https://download.pytorch.org/whl/$(TORCH_CUDA) || $(BIN)/pip install -q 'torch>=2.13' --index-url https://download.pytorch.org/whl/$(TORCH_CUDA)
else
	@echo "setup: [3/4] installing PyTorch $(TORCH_VERSION), CPU build (make setup TORCH=cuda for the CUDA one)"
	# CPU torch first: a plain `torch` requirement would fetch a multi-GB CUDA build.
	$(BIN)/python -c $(call OTHER_TORCH,False) || $(BIN)/pip uninstall -q -y torch
	$(BIN)/pip install -q torch==$(TORCH_VERSION) || $(BIN)/pip install -q 'torch>=2.13' --index-url https://download.pytorch.org/whl/cpu
endif
	@echo "setup: [4/4] installing llm and its dev tools (pip install -e '.[dev]')"
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps litdata mosaicml-streaming  # tests/interop's peers; --no-deps keeps this torch
	@$(BIN)/python -c "import torch; b = 'CUDA ' + torch.version.cuda if torch.version.cuda else 'CPU'; print(f'setup: PyTorch {torch.__version__} ({b} build)')"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

setup: $(STAMP) azurite

# Into .venv/azurite, so it goes with the venv (about a minute; needs node and npm, else apt-get nodejs npm).
# The tests always start it with --disableTelemetry (tests/storage/azurite.py).
azurite:
	@if [ -x $(AZURITE) ] && [ "$$($(AZURITE) --version 2>/dev/null)" = "$(AZURITE_VERSION)" ]; then \
		echo "setup: Azurite $(AZURITE_VERSION) already in $(VENV)/azurite"; \
	elif command -v npm >/dev/null; then \
		echo "setup: installing Azurite $(AZURITE_VERSION) (npm) into $(VENV)/azurite for the az:// tests"; \
		npm install --prefix $(VENV)/azurite --no-audit --no-fund --loglevel=error azurite@$(AZURITE_VERSION); \
	else \
		echo "setup: npm is missing: install Node.js and npm (apt-get install nodejs npm), then run make azurite" >&2; \
		exit 1; \
	fi

# `make test`'s Azurite: installed as above when npm is there (once; later runs find it in .venv/azurite), so the
# quick suite's az:// tests run; without npm it says so and goes on, and those tests skip naming `make azurite`.
azurite-if-npm:
	@if command -v npm >/dev/null; then \
		$(MAKE) --no-print-directory azurite; \
	else \
		echo "setup: npm is missing, so the az:// tests will skip: install Node.js and npm (apt-get install nodejs npm), then make azurite" >&2; \
	fi

demo: $(STAMP)
	@echo "demo: running python -m llm.demo (about a minute on a laptop CPU)"
	$(BIN)/python -m llm.demo

# Quick: everything but the tests marked slow (a few minutes on 2 cores). Slow: end-to-end repeats whose code
# path a quick test also covers (llm-train and other subprocesses, kill -9, several processes, Ray, the az/gs
# runs of store-independent paths); config and argument checks call main() in process instead.
# -n auto: one pytest process per core (pytest-xdist); each starts its own test servers on free ports (SeaweedFS,
# Azurite, a GCS server; all on 127.0.0.1, telemetry off).
test: $(STAMP) azurite-if-npm
	$(BIN)/python -m pytest tests -m "not slow" -n auto $(PYTEST_ARGS)

# Everything, in one process; CI (.ci/run) runs it after `make test`.
test-all: $(STAMP) azurite
	$(BIN)/python -m pytest tests $(PYTEST_ARGS)

# The declared floors, tested: pyproject.toml's minimum numpy, pyarrow and torch (read off it by .ci/floors.py),
# installed together into a venv of their own with the package, then the quick shard, text, dedup and mixing
# tests, so that code needing a newer release than pyproject declares fails here (np.trapezoid, which NumPy
# 1.x lacks, once did). CI runs it. The torch floor is a CPU build: a plain `torch==` would take a CUDA one.
# HF `datasets` (the hf extra, not a floor of the package) is not installed: its four tests are left out. The
# metrics and dedup-fast extras are: the shard tests scrape the Prometheus endpoint, the dedup tests run rensa.
MIN_VENV := .venv-min
MIN_TESTS := tests/data/shards tests/data/text tests/data/corpus_dedup
MIN_DESELECT := --deselect tests/data/text/test_presets.py::test_the_hf_source_iterates_a_dataset_with_skip_and_iter_but_no_iter_method \
	--deselect tests/data/text/test_sources.py::test_hf_streaming_source_from_local_files \
	--deselect "tests/data/text/test_stream.py::test_exact_resume_other_sources[hf-0]" \
	--deselect "tests/data/text/test_stream.py::test_other_topologies_hf_and_parquet[hf]"
test-min:
	test -x $(MIN_VENV)/bin/python || $(PY) -m venv $(MIN_VENV)
	$(PY) .ci/floors.py numpy pyarrow torch > $(MIN_VENV)/floors.txt
	@echo "test-min: installing the declared floors: $$(tr '\n' ' ' < $(MIN_VENV)/floors.txt)"
	$(MIN_VENV)/bin/pip install -q "$$(grep '^torch==' $(MIN_VENV)/floors.txt)+cpu" || $(MIN_VENV)/bin/pip install -q "$$(grep '^torch==' $(MIN_VENV)/floors.txt)" --index-url https://download.pytorch.org/whl/cpu
	$(MIN_VENV)/bin/pip install -q -c $(MIN_VENV)/floors.txt -e '.[encryption,json,tiktoken,metrics,dedup-fast]' pytest pytest-timeout hypothesis psutil
	$(MIN_VENV)/bin/python -c "import numpy, pyarrow, torch; print(f'test-min: numpy {numpy.__version__}, pyarrow {pyarrow.__version__}, torch {torch.__version__}')"
	$(MIN_VENV)/bin/python -m pytest $(MIN_TESTS) -m "not slow" $(PYTEST_ARGS) $(MIN_DESELECT)

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/pip install -q --no-deps litdata  # see pyproject.toml: keeps the CPU torch
	$(BIN)/pip install -q --no-deps datatrove  # bench/dedup.py's peer; see pyproject.toml's bench extra
	$(BIN)/python -m bench
