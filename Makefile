# The two commands the README promises: `make run` and `make test`. Both bootstrap .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all run test lint native protos clean bench

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

native: $(STAMP)
	@if [ -f native/vgpu/Makefile ]; then $(MAKE) -C native/vgpu; fi

# The device-plugin gRPC stubs are generated from the proto in the build, never edited by hand.
protos: $(STAMP)
	@if [ -f libs/hami_common/deviceplugin/generate.py ]; then $(BIN)/python -m hami_common.deviceplugin.generate; fi

test: $(STAMP) native protos
	$(BIN)/python -m pytest

run: $(STAMP) native protos
	$(BIN)/hami up

lint: $(STAMP) protos
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP) native protos  # BENCH_ARGS=--quick for a short run
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b $(BENCH_ARGS) || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
	@if [ -f native/vgpu/Makefile ]; then $(MAKE) -C native/vgpu clean; fi
