"""The extender's probe port stays bounded under a flood of connections that never send a whole request
(issue 28 item 4).

The probe port is the extender's only listener a network neighbour can reach: the API listens on the pod's
loopback (tests/deploy/test_listeners.py), the probe port on the pod's address, for the kubelet. It is served
under the webhook's guard (:mod:`hami_common.connections`): a cap on open connections (at the cap the oldest
connection not being answered is dropped for a newcomer) and a deadline for a whole request. Each flood here
mixes silent connections, requests stopped in their headers, and truncated TLS ClientHellos (a handshake
flood sent to the plain port); the kubelet's GET /healthz is answered throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import resource
from collections.abc import AsyncIterator, Iterator
from typing import Final

import httpx
import pytest

from hami_extender.main import serve
from hami_extender.settings import ExtenderSettings
from hami_sim.waiting import eventually
from tests.extender.conftest import free_port

FLOOD: Final = 1000
CAP: Final = 64
WAVE: Final = 100  # connections opened at once: the listen backlog is finite
HALF_SENT: Final = b"GET /healthz HTTP/1.1\r\nHost: 10.0.0.7:8081\r\nUser-Agent: kube-probe/1.31\r\nAcc"
TRUNCATED_HELLO: Final = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40
GIVE_UP_S: Final = 60.0  # a guard against hanging for ever, not a latency claim


@pytest.fixture
def enough_files() -> Iterator[None]:
    """Both ends of every connection live in this process: raise the open-file limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 3 * FLOOD
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard open-file limit {hard} is below {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextlib.asynccontextmanager
async def probed_extender(settings: ExtenderSettings, read_timeout: float) -> AsyncIterator[httpx.AsyncClient]:
    """The extender serving, and a kubelet's client of its probe port once that answers."""
    probe_port = free_port()
    served = dataclasses.replace(
        settings,
        http_port=free_port(),
        health_port=probe_port,
        health_host="127.0.0.1",
        health_max_connections=CAP,
        health_read_timeout=read_timeout,
    )
    stop = asyncio.Event()
    serving = asyncio.create_task(serve(served, stop))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{probe_port}", timeout=30.0) as kubelet:

            async def answered() -> bool:
                assert not serving.done(), serving
                try:
                    return (await kubelet.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(answered, what="the probe port answering")
            yield kubelet
    finally:
        stop.set()
        await asyncio.wait_for(serving, GIVE_UP_S)


@dataclasses.dataclass
class Flood:
    """Connections that never send a whole request, each watched until the server drops it."""

    port: int
    writers: list[asyncio.StreamWriter] = dataclasses.field(default_factory=list)
    dropped: list[asyncio.Task[bytes]] = dataclasses.field(default_factory=list)  # in the order opened

    async def open(self, count: int) -> None:
        for start in range(0, count, WAVE):
            await asyncio.gather(*(self.one(i) for i in range(start, min(count, start + WAVE))))

    async def one(self, i: int) -> asyncio.Task[bytes]:
        """Connection ``i``: silent, half-sent or a truncated ClientHello, by ``i`` modulo 3."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writers.append(writer)
        sent = (b"", HALF_SENT, TRUNCATED_HELLO)[i % 3]
        if sent:
            writer.write(sent)
            await writer.drain()
        dropped = asyncio.create_task(self._until_dropped(reader))
        self.dropped.append(dropped)
        return dropped

    @staticmethod
    async def _until_dropped(reader: asyncio.StreamReader) -> bytes:
        """What the server sent before it dropped the connection (EOF or reset)."""
        received = b""
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                received += chunk
        return received

    def open_count(self) -> int:
        return sum(not task.done() for task in self.dropped)

    async def close(self) -> None:
        for writer in self.writers:
            writer.close()
        await asyncio.wait_for(asyncio.gather(*self.dropped), GIVE_UP_S)


async def test_a_flood_of_connections_that_send_no_whole_request_is_held_to_the_cap(
    settings: ExtenderSettings, enough_files: None
) -> None:
    """The deadline is far off here: only the cap can drop these connections. Without it all 1,000 stay open
    (for the old fixed 5 s), so the newest ones are dropped with the rest; with it the oldest go first."""
    async with probed_extender(settings, read_timeout=GIVE_UP_S) as kubelet:
        port = kubelet.base_url.port
        assert port is not None
        flood = Flood(port)
        try:
            await flood.open(FLOOD)
            # then one of each kind, one at a time: the newest connections, accepted in this order
            silent, half_sent, hello = [await flood.one(i) for i in range(3)]
            # every connection beyond the cap was dropped to make room; the kubelet still gets its answer
            await eventually(lambda: flood.open_count() <= CAP, what=f"at most {CAP} probe connections open")
            assert (await kubelet.get("/healthz")).status_code == 200
            # the cap dropped the oldest: the newest are still open, waiting for their far-off deadline
            assert not silent.done(), "the newest connections were dropped too"
            assert not half_sent.done(), "the newest connections were dropped too"
            # not HTTP: answered 400 and closed at once
            assert (await asyncio.wait_for(hello, GIVE_UP_S)).startswith(b"HTTP/1.1 400 ")
        finally:
            await flood.close()


async def test_a_probe_connection_that_sends_no_whole_request_is_dropped_at_its_deadline(
    settings: ExtenderSettings, enough_files: None
) -> None:
    async with probed_extender(settings, read_timeout=1.0) as kubelet:
        port = kubelet.base_url.port
        assert port is not None
        flood = Flood(port)
        try:
            await flood.open(CAP // 2)  # under the cap: only the deadline drops them
            sent = await asyncio.wait_for(asyncio.gather(*flood.dropped), GIVE_UP_S)
            assert {answer[:13] for answer in sent} <= {b"", b"HTTP/1.1 400 "}
            assert sum(answer == b"" for answer in sent) == len(sent) - len(sent) // 3  # dropped without an answer
            assert (await kubelet.get("/healthz")).status_code == 200
            assert (await kubelet.get("/bind")).status_code == 404
        finally:
            await flood.close()
