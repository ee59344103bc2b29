"""A subscription is live when ``Bus.subscribe`` returns, even when the server reads the client's PING first.

nats-py writes ``flush()``'s PING ahead of a SUB still in its pending buffer. The server here is a minimal
NATS protocol peer that answers PING at once but takes its time over each SUB, which is how a loaded
nats-server looks to the client: with one flush, ``subscribe`` returned before the server had the SUB.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from hami_common.bus import Bus
from hami_common.events import UsageSample
from hami_common.settings import BusSettings

_INFO = b'INFO {"server_id":"probe","version":"2.10.0","proto":1,"max_payload":1048576,"headers":true}\r\n'
_SUB_DELAY_S = 0.2


class SlowSubServer:
    """Answers PING with PONG as soon as it reads it; records each SUB only after a pause, in order."""

    def __init__(self) -> None:
        self.subjects: list[str] = []
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_INFO)
        await writer.drain()
        while line := await reader.readline():
            if line.startswith(b"PING"):
                writer.write(b"PONG\r\n")
                await writer.drain()
            elif line.startswith(b"SUB "):
                await asyncio.sleep(_SUB_DELAY_S)
                self.subjects.append(line.split()[1].decode())
        writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"nats://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def slow_server() -> AsyncIterator[SlowSubServer]:
    probe = SlowSubServer()
    probe.server = await asyncio.start_server(probe.handle, "127.0.0.1", 0)
    yield probe
    probe.server.close()


async def test_subscribe_returns_only_after_the_server_has_the_subscription(slow_server: SlowSubServer) -> None:
    async def ignore(event: UsageSample, _: object) -> None:
        return None

    async with await Bus.connect(BusSettings(nats_url=slow_server.url, service_name="probe"), give_up_after=5) as bus:
        await bus.subscribe("hami-test.usage", UsageSample, ignore)
        assert slow_server.subjects == ["hami-test.usage"]
