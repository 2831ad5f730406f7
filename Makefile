# Quick start: `make demo` (set up + run the quickstart scenario), `make test` (set up + run the tests).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install -q -c constraints.txt

.PHONY: setup demo test test-slow bench lint clean

$(BIN)/netsim: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev,ray]'
	touch $@

setup: $(BIN)/netsim

demo: setup
	$(BIN)/netsim run scenarios/quickstart.toml --force

test: setup
	$(BIN)/pytest -q -n 2 || [ $$? -eq 5 ]

test-slow: setup
	$(BIN)/pytest -q -m slow

bench: setup
	$(BIN)/python benchmarks/kernel.py

lint: setup
	$(BIN)/ruff check netsim tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
