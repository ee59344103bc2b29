# syntax=docker/dockerfile:1
# One image for every service (hami-webhook, hami-extender, hami-allocator, hami-nodeagent, hami-metrics, hami-natsauth,
# hami) and libvgpu.so. Build: docker build -t hami-py:dev .
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# --- libvgpu.so, the CUDA driver and NVML interposer (native/vgpu) ---------------------------------------
FROM ${PYTHON_IMAGE} AS native
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY native/vgpu/ native/vgpu/
RUN make -C native/vgpu build/libvgpu.so \
 && install -D -m 0644 native/vgpu/build/libvgpu.so /out/vgpu/libvgpu.so \
 && printf '/usr/local/vgpu/libvgpu.so\n' > /out/vgpu/ld.so.preload

# --- the web page's charting library, from webui/package-lock.json (as `make webui` builds it) -----------
FROM node:20-bookworm-slim AS webui
WORKDIR /webui
COPY webui/package.json webui/package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund \
 && mkdir -p /out \
 && cp node_modules/uplot/dist/uPlot.iife.min.js node_modules/uplot/dist/uPlot.min.css /out/ \
 && cp node_modules/uplot/LICENSE /out/uPlot.LICENSE

# --- the Python package and its dependencies, in a virtual environment -----------------------------------
FROM ${PYTHON_IMAGE} AS python
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/hami
WORKDIR /src
COPY pyproject.toml README.md ./
COPY libs/ libs/
COPY harness/ harness/
COPY services/ services/
COPY --from=webui /out/ services/metrics/hami_metrics/static/vendor/
# The device-plugin gRPC stubs are generated in the build, never committed.
RUN /opt/hami/bin/pip install grpcio-tools \
 && PYTHONPATH=libs /opt/hami/bin/python -m hami_common.deviceplugin.generate \
 && /opt/hami/bin/pip uninstall -y grpcio-tools \
 && /opt/hami/bin/pip install .

# --- runtime ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 hami \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin hami
COPY --from=python /opt/hami /opt/hami
COPY --from=native /out/vgpu/ /opt/hami/vgpu/
COPY --chmod=0755 deploy/generate-secrets.sh /opt/hami/bin/hami-generate-secrets
# Owned by the service user, so a fresh named volume mounted here is writable (docker-compose.yml's certs).
RUN install -d -o 65532 -g 65532 -m 0755 /var/lib/hami /var/lib/hami/certs
ENV PATH=/opt/hami/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root by default; only the node DaemonSet overrides it (root-owned host directories, no capabilities).
USER 65532:65532
CMD ["hami", "--help"]
