"""Idle and half-sent connections cannot exhaust the webhook (issue 16 item 8).

The ``hami-webhook`` command runs as its own process over TLS. The test holds 2,000 connections to it (half
idle after the handshake, half stopped in the middle of a request's headers): the webhook still answers an
AdmissionReview, its memory stays bounded, and it drops every one of those connections itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import httpx
import pytest

from hami_common.connections import HEADERS_TOO_LARGE
from hami_common.resources import GPU
from hami_sim.waiting import eventually_sync
from tests.webhook.conftest import TlsFiles
from tests.webhook.support import ServedWebhook, container, pod, response_of, review

CONNECTIONS: Final = 2000
MAX_CONNECTIONS: Final = 256
READ_TIMEOUT_S: Final = 3.0
# Measured on uvloop: with the guard (at most 256 held) RSS grows ~26 MiB; without it all 2,000 stay and it
# grows ~66 MiB (the issue saw 724 MB for 8,000). The bound sits between, with room for allocator noise.
RSS_GROWTH_BOUND: Final = 48 * 1024 * 1024
HALF_SENT: Final = b"POST /webhook?timeout=10s HTTP/1.1\r\nHost: hami-webhook\r\nContent-Type: appl"
GIVE_UP_S: Final = 120.0  # a guard against hanging for ever, not a latency claim


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def enough_files() -> Iterator[None]:
    """Both ends hold every connection: raise the open-file limit (the webhook inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 3 * CONNECTIONS
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard open-file limit {hard} is below {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def webhook_process(tls_files: TlsFiles, enough_files: None) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = _free_port()
    command = [
        sys.executable, "-c", "import sys; from hami_webhook.main import main; sys.exit(main(sys.argv[1:]))",
        "--host", "127.0.0.1", "--port", str(port), "--tls-cert-file", str(tls_files.cert),
        "--tls-key-file", str(tls_files.key), "--no-watch-cluster", "--no-publish-events",
        "--max-connections", str(MAX_CONNECTIONS), "--read-timeout", str(READ_TIMEOUT_S),
        "--handshake-timeout", str(READ_TIMEOUT_S),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield process, f"https://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def _wait_listening(client: httpx.Client, process: subprocess.Popen[bytes], url: str) -> None:
    def up() -> bool:
        assert process.poll() is None, process.communicate()[0].decode()
        try:
            return client.get(url + "/readyz").status_code == 200
        except httpx.TransportError:
            return False

    eventually_sync(up, what="hami-webhook listening")


def _admits(client: httpx.Client, url: str) -> bool:
    answer = client.post(url + "/webhook?timeout=10s", json=review(pod(container(limits={GPU: "1"}))))
    assert answer.status_code == 200, answer.text
    return bool(response_of(answer.content)["allowed"])


async def _hold(
    port: int, tls: ssl.SSLContext, half_sent: bool, writers: list[asyncio.StreamWriter]
) -> asyncio.StreamReader | None:
    """One connection, left idle after the handshake or stopped mid-headers; None: the server refused it."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
        writers.append(writer)
        if half_sent:
            writer.write(HALF_SENT)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, OSError):
        return None
    return reader


async def _dropped(reader: asyncio.StreamReader) -> None:
    """Returns once the server has dropped the connection (EOF or reset): it never sends an answer."""
    with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
        data = await reader.read(65536)
        assert data == b"", f"the server answered a request it never got whole: {data[:80]!r}"


def test_two_thousand_idle_connections_neither_block_admission_nor_exhaust_memory(
    webhook_process: tuple[subprocess.Popen[bytes], str], tls_files: TlsFiles
) -> None:
    process, url = webhook_process
    tls = ssl.create_default_context(cafile=str(tls_files.cert))
    with httpx.Client(verify=tls, timeout=30.0) as client:
        _wait_listening(client, process, url)
        assert _admits(client, url)
        before = _rss(process.pid)
        port = int(url.rsplit(":", 1)[1])

        async def attack() -> tuple[int, int]:
            writers: list[asyncio.StreamWriter] = []
            readers: list[asyncio.StreamReader] = []
            for start in range(0, CONNECTIONS, 200):  # in waves: the listen backlog is finite
                opened = await asyncio.gather(
                    *(_hold(port, tls, i % 2 == 1, writers) for i in range(start, start + 200))
                )
                readers.extend(r for r in opened if r is not None)
            # every connection is open (or was already dropped): the webhook must still answer the apiserver
            admitted = await asyncio.to_thread(_admits, client, url)
            grown = _rss(process.pid) - before
            assert admitted
            # and it drops every held connection itself, idle or half-sent
            await asyncio.wait_for(asyncio.gather(*(_dropped(r) for r in readers)), GIVE_UP_S)
            for writer in writers:
                writer.close()
            return len(readers), grown

        opened, grown = asyncio.run(attack())
        assert opened > MAX_CONNECTIONS  # the cap drops the oldest idle connection; it does not refuse newcomers
        assert grown < RSS_GROWTH_BOUND, f"RSS grew by {grown // 1024} KiB holding {CONNECTIONS} connections"
        assert process.poll() is None
        assert _admits(client, url)


def test_a_request_head_past_the_header_budget_is_refused_and_dropped(
    webhook: ServedWebhook, tls_files: TlsFiles
) -> None:
    """Headers that never end would otherwise be buffered for as long as the client keeps sending."""
    host, port = webhook.url.removeprefix("https://").rsplit(":", 1)
    tls = ssl.create_default_context(cafile=str(tls_files.cert))
    with (
        socket.create_connection((host, int(port)), timeout=GIVE_UP_S) as raw,
        tls.wrap_socket(raw, server_hostname=host) as conn,
    ):
        # just past the default budget (64 KiB): the server reads all of it, so it can answer before closing
        head = b"POST /webhook HTTP/1.1\r\nHost: hami-webhook\r\nX-Padding: "
        conn.sendall(head + b"a" * (64 * 1024 + 1024 - len(head)))
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert HEADERS_TOO_LARGE.encode() in answer


async def _half_open(port: int, hello: bytes, held: list[asyncio.StreamWriter]) -> asyncio.StreamReader | None:
    """A TCP connection that starts (or never starts) a TLS handshake and never finishes it."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return None
    held.append(writer)
    if hello:
        writer.write(hello)
        with contextlib.suppress(OSError):
            await writer.drain()
    return reader


def test_connections_that_never_finish_the_tls_handshake_count_against_the_cap_and_are_dropped(
    webhook_process: tuple[subprocess.Popen[bytes], str], tls_files: TlsFiles
) -> None:
    """Issue 28 item 4: a connection still in its TLS handshake escaped the cap and the read deadline and
    lived for the event loop's 60 s handshake timeout; 6,000 of them raised the webhook's memory from 75 to
    412 MiB. Now it is under the cap from the moment it is accepted (the oldest is dropped for a newcomer), and
    its handshake has its own short deadline. Half of these send nothing, half a truncated ClientHello."""
    process, url = webhook_process
    tls = ssl.create_default_context(cafile=str(tls_files.cert))
    with httpx.Client(verify=tls, timeout=30.0) as client:
        _wait_listening(client, process, url)
        before = _rss(process.pid)
        port = int(url.rsplit(":", 1)[1])
        truncated_hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40

        async def attack() -> tuple[int, int, int]:
            held: list[asyncio.StreamWriter] = []
            readers: list[asyncio.StreamReader] = []
            for start in range(0, CONNECTIONS, 200):
                opened = await asyncio.gather(
                    *(_half_open(port, truncated_hello if i % 2 else b"", held) for i in range(start, start + 200))
                )
                readers.extend(r for r in opened if r is not None)
            admitted = await asyncio.to_thread(_admits, client, url)
            grown = _rss(process.pid) - before
            assert admitted
            # at the cap the oldest are dropped as newcomers arrive: well before any handshake deadline, all but
            # the newest MAX_CONNECTIONS are closed (with the loop's own 60 s timeout, none was)
            evicted = 0
            for _ in range(100):
                await asyncio.sleep(0.1)
                evicted = sum(r.at_eof() for r in readers)
                if evicted >= len(readers) - MAX_CONNECTIONS:
                    break
            # and the rest are dropped by their handshake deadline
            await asyncio.wait_for(asyncio.gather(*(_dropped(r) for r in readers)), GIVE_UP_S)
            for writer in held:
                writer.close()
            return len(readers), evicted, grown

        opened, evicted, grown = asyncio.run(attack())
        assert opened == CONNECTIONS
        assert evicted >= CONNECTIONS - MAX_CONNECTIONS, f"only {evicted} of {opened} half-open connections dropped"
        assert grown < RSS_GROWTH_BOUND, f"RSS grew by {grown // 1024} KiB holding {CONNECTIONS} handshakes"
        assert process.poll() is None
        assert _admits(client, url)
