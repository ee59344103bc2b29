"""Fixtures of the end-to-end tests: a whole local cluster (its nodes in a child process), and a span recorder."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hami_sim.stack import LocalCluster, StackConfig


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Every span of every in-process service, kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace._TRACER_PROVIDER_SET_ONCE._done = False  # tests install their own provider each time
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()


def stack_config(tmp_path: Path, sockdir: Path, *, nodes: int, gpus: int = 8, node_hosts: int = 1) -> StackConfig:
    """The nodes run in a child process, as in the benchmark, unless a test needs their spans (node_hosts=0)."""
    return StackConfig(
        workdir=tmp_path / "stack",
        sockdir=sockdir,
        nodes=nodes,
        gpus_per_node=gpus,
        node_policy="spread",
        node_hosts=node_hosts,
    )


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """Unix sockets want short paths; pytest's tmp_path can be too long for them."""
    with tempfile.TemporaryDirectory(prefix="hami-e2e-") as folder:
        yield Path(folder)


@pytest.fixture
async def cluster(tmp_path: Path, sockdir: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(stack_config(tmp_path, sockdir, nodes=10)) as running:
        yield running
