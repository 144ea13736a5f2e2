# Everything a newcomer needs: `make demo` and `make test` create .venv and install on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test lint typecheck pytest torture bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,all]'
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(STAMP)
	$(BIN)/toolledger demo

lint: $(STAMP)
	$(BIN)/ruff check src tests examples bench
	$(BIN)/ruff format --check src tests examples bench

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest -q

test: lint typecheck pytest

torture: $(STAMP)
	$(BIN)/python -m toolledger.testing.torture --kills 10000

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
