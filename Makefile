# Everything a newcomer needs: `make demo` and `make test` create .venv and install on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: demo test lint typecheck docs pytest browser valgrind torture torture-concurrent simulate bench bench-full clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,docs,all,recipes]'
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(STAMP)
	$(BIN)/toolledger demo

lint: $(STAMP)
	$(BIN)/ruff check src tests examples bench docs_nav.py
	$(BIN)/ruff format --check src tests examples bench docs_nav.py
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

# The documentation site, built as it would be published: a broken link or reference fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/site

# The console's browser tests drive Debian's chromium: installed here when it is missing.
browser:
	test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || .ci/install-browser

# The bench counts instructions under valgrind's callgrind: installed here when it is missing.
valgrind:
	command -v valgrind >/dev/null || .ci/install-valgrind

# The suite on WORKERS processes (pytest-xdist); tests that share a module's server or browser
# stay together (tests/conftest.py). Most tests wait on processes, disks and sockets more than
# they compute, so a worker more than the cores keeps them busy. The suite runs every snippet of the README
# and docs, and builds the wheel and runs the demo from it in a fresh venv (tests/test_release.py).
WORKERS ?= 3
# Then every guarantee's suites again with the common call's straight path switched off
# (src/toolledger/engine/_straight.py): the general path must keep the same promises, and the
# first run proved the straight one.
GENERAL_PATH_SUITES := tests/stores tests/agent/test_crash_matrix.py \
	tests/agent/test_branch_crashes.py tests/reliability/test_torture.py \
	tests/reliability/test_concurrent_torture.py tests/reliability/test_simulation.py \
	tests/test_runner.py tests/test_runner_faults.py tests/test_overlap.py \
	tests/test_lineage_calls.py tests/test_straight_path.py
pytest: $(STAMP) browser valgrind
	$(BIN)/pytest -q -n $(WORKERS) --dist loadgroup
	TOOLLEDGER_GENERAL_PATH=1 $(BIN)/pytest -q -n $(WORKERS) --dist loadgroup $(GENERAL_PATH_SUITES)

test: lint typecheck docs pytest

# 10,000 SIGKILLs at random instants, every session checked against the world (about 12 minutes
# on 2 cores). BACKEND=json|postgres, KILLS=N and SEED=S vary it; `make test` runs a few hundred.
KILLS   ?= 10000
BACKEND ?= sqlite
torture: $(STAMP)
	$(BIN)/python -m toolledger._harness.torture --kills $(KILLS) --backend $(BACKEND) $(if $(SEED),--seed $(SEED))

# Workers sharing one store for SECONDS of chaos — SIGSTOPped past their leases and deadlines,
# SIGKILLed and replaced, one acting as another host, clocks skewed, an operator approving and
# resolving — then every session finished and checked against the world. BACKEND and SEED as above;
# `make test` runs a few seconds of it per backend.
SECONDS ?= 600
torture-concurrent: $(STAMP)
	$(BIN)/python -m toolledger._harness.concurrent_torture --seconds $(SECONDS) --backend $(BACKEND) $(if $(SEED),--seed $(SEED))

# The deterministic simulation, for MINUTES twice: every fault on, then every fault on every kind
# of machine (process tables missing, hidden or another namespace's, time namespaces, file-store
# clocks that step). A failing seed replays with the command it prints. `make test` runs a minute.
MINUTES ?= 30
simulate: $(STAMP)
	$(BIN)/python -m toolledger._harness.simulation --minutes $(MINUTES) --first $(or $(SEED),0) --everything
	$(BIN)/python -m toolledger._harness.simulation --minutes $(MINUTES) --first $(or $(SEED),0) --everywhere
	$(BIN)/python -m toolledger._harness.simulation --minutes $(MINUTES) --first $(or $(SEED),0) --branchy

BENCH_STAMP := $(VENV)/.bench-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,all,recipes,bench]'
	rm -f $(VENV)/.bench-*
	touch $@

# The benchmarks (~10 min; `python -m bench --quick` takes about one).
bench: $(BENCH_STAMP) valgrind
	$(BIN)/python -m bench

# The same run, also refreshing the figures in README.md, docs/performance.md and docs/bench.png.
bench-full: $(BENCH_STAMP) valgrind
	$(BIN)/python -m bench --publish

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
