# gputop -- every target creates the virtualenv first if it is missing.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help demo test lint bench fuzz soak screenshots wheel-check clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch pinned to the CPU wheel first, so nothing later resolves a CUDA build
	$(BIN)/pip install -q torch==2.13.0
	# (setuptools' note on editable installs is about this very layout: silenced)
	PYTHONWARNINGS=ignore $(BIN)/pip install -q -e '.[demo,dev,frameworks]'
	touch $(STAMP)

demo: $(STAMP)  ## train a small CNN on the CPU and watch it in gputop (SCENARIO=input-bound|compute-bound|balanced|disk-bound|stall|worker-restarts)
	$(BIN)/gputop demo --scenario $(or $(SCENARIO),input-bound)

test: $(STAMP)  ## run the whole test suite
	$(BIN)/pytest -q

lint: $(STAMP)  ## ruff and mypy
	$(BIN)/ruff check --no-cache gputop_dl probe tui tests bench tools
	$(BIN)/ruff format --no-cache --check gputop_dl probe tui tests bench tools
	$(BIN)/mypy

bench: $(STAMP)  ## print the probe, sampler and viewer cost figures
	$(BIN)/python bench/probe_overhead.py
	$(BIN)/python bench/probe_instructions.py
	$(BIN)/python bench/probe_window.py
	$(BIN)/python bench/sampler_cost.py
	$(BIN)/python bench/publisher_gil.py
	$(BIN)/python bench/short_passes.py
	$(BIN)/python bench/accel_cost.py
	$(BIN)/python bench/wire_size.py
	$(BIN)/python bench/viewer_ingest.py
	$(BIN)/python bench/demo_throughput.py
	$(BIN)/python bench/frameworks_throughput.py
	$(BIN)/python bench/viewer_cpu.py
	$(BIN)/python bench/viewer_flood.py

fuzz: $(STAMP)  ## decode 1,000,000 mutated protocol payloads (fixed seed): only protocol errors
	GPUTOP_FUZZ_N=1000000 $(BIN)/pytest -q tests/test_protocol.py -k mutated

soak: $(STAMP)  ## the real viewer for 10 min against flooding, churning and hostile publishers: RSS flat? (SOAK_SECONDS=600)
	$(BIN)/python bench/soak.py

screenshots: $(STAMP)  ## render screenshots/ from the real app on a real demo run
	$(BIN)/python tools/screenshots.py screenshots

wheel-check: $(STAMP)  ## build the wheel; install it (not editable) in clean venvs, full and probe-only
	$(BIN)/python .ci/wheel_check.py

clean:  ## remove the virtualenv, caches and the demo's generated dataset
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
	rm -rf "$$(python3 -c 'import tempfile; print(tempfile.gettempdir())')/gputop-demo-data"
