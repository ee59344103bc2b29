"""Fixtures shared by every test: a real nats-server, a connected bus, the upstream fixtures folder."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from opentelemetry import trace

from hami_common.bus import Bus, EmbeddedNats
from hami_common.settings import BusSettings

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_FIXTURES = REPO_ROOT.parent / "shared" / "fixtures"


@pytest.fixture(autouse=True)
def _restore_tracer_provider() -> Iterator[None]:
    """OpenTelemetry's tracer provider is process-global: a test that installs one must not leak it into
    the next (a later test would then see recording spans, and trace annotations, it did not ask for)."""
    saved = (trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE._done)
    yield
    trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE._done = saved


@pytest.fixture
def nats_server() -> Iterator[EmbeddedNats]:
    """A fresh nats-server with JetStream on a free loopback port, stopped after the test."""
    with EmbeddedNats() as server:
        yield server


@pytest.fixture
async def bus(nats_server: EmbeddedNats) -> AsyncIterator[Bus]:
    async with await Bus.connect(BusSettings(nats_url=nats_server.url, service_name="test")) as connected:
        yield connected


@pytest.fixture
def shared_fixtures() -> Path:
    if not SHARED_FIXTURES.is_dir():
        pytest.skip(f"upstream fixtures not found beside the checkout ({SHARED_FIXTURES.name})")
    return SHARED_FIXTURES
