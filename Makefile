# The two commands the README promises: `make run` and `make test`. Both bootstrap .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all run test lint native clean bench

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

native: $(STAMP)
	@if [ -f native/vgpu/Makefile ]; then $(MAKE) -C native/vgpu; fi

test: $(STAMP) native
	$(BIN)/python -m pytest

run: $(STAMP) native
	$(BIN)/hami run

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
	@if [ -f native/vgpu/Makefile ]; then $(MAKE) -C native/vgpu clean; fi
