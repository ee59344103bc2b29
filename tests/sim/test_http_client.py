"""The lean HTTP/1.1 client of the emulated peers, against real uvicorn servers and raw sockets."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from hami_sim.http import HttpClient, HttpError
from hami_sim.stack._http import bind_loopback, serve_app
from hami_sim.tls import write_serving_certificate

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _app(peers: list[tuple[str, int]]) -> Starlette:
    async def echo(request: Request) -> Response:
        if request.client is not None:
            peers.append((request.client.host, request.client.port))
        body = await request.body()
        return JSONResponse(
            {"method": request.method, "path": request.url.path, "query": request.url.query, "body": body.decode(),
             "type": request.headers.get("content-type", ""), "token": request.headers.get("authorization", "")}
        )  # fmt: skip

    async def chunks(request: Request) -> Response:
        async def parts() -> AsyncIterator[bytes]:
            for i in range(5):
                yield f"part{i};".encode()

        return StreamingResponse(parts(), media_type="text/plain")

    async def missing(request: Request) -> Response:
        return Response(b"nothing here", status_code=404)

    async def empty(request: Request) -> Response:
        return Response(status_code=204)

    routes = [
        Route("/echo", echo, methods=["GET", "POST", "PATCH"]),
        Route("/chunks", chunks),
        Route("/missing", missing),
        Route("/empty", empty, methods=["DELETE"]),
    ]
    return Starlette(routes=routes)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[str, list[tuple[str, int]]]]:
    peers: list[tuple[str, int]] = []
    sock = bind_loopback()
    port = sock.getsockname()[1]
    stop = asyncio.Event()
    serving = asyncio.create_task(serve_app(_app(peers), sock, stop))
    client = HttpClient(f"http://127.0.0.1:{port}", timeout=5)
    for _ in range(200):
        try:
            await client.get("/missing")
            break
        except HttpError:
            await asyncio.sleep(0.02)
    await client.aclose()
    peers.clear()
    yield f"http://127.0.0.1:{port}", peers
    stop.set()
    await serving


async def _raw_server(handler: Handler) -> tuple[asyncio.Server, int]:
    srv = await asyncio.start_server(handler, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


async def test_post_get_and_keep_alive_reuse_one_connection(server: tuple[str, list[tuple[str, int]]]) -> None:
    url, peers = server
    client = HttpClient(url, headers={"Authorization": "Bearer t0ken"})
    first = await client.post("/echo", b'{"a": 1}')
    second = await client.get("/echo?x=1")
    await client.aclose()
    assert first.status == 200
    assert first.json() == {
        "method": "POST", "path": "/echo", "query": "", "body": '{"a": 1}', "type": "application/json",
        "token": "Bearer t0ken",
    }  # fmt: skip
    assert (second.json()["method"], second.json()["query"]) == ("GET", "x=1")
    assert len(set(peers)) == 1, "the second request should reuse the kept-alive connection"


async def test_status_codes_chunked_and_empty_bodies(server: tuple[str, list[tuple[str, int]]]) -> None:
    url, _ = server
    client = HttpClient(url)
    missing = await client.get("/missing")
    chunked = await client.get("/chunks")
    empty = await client.request("DELETE", "/empty")
    after = await client.request("PATCH", "/echo", b"x")
    await client.aclose()
    assert (missing.status, missing.text) == (404, "nothing here")
    assert chunked.body == b"part0;part1;part2;part3;part4;"
    assert (empty.status, empty.body) == (204, b"")
    assert after.json()["body"] == "x"


async def test_concurrent_requests_are_bounded_by_the_pool(server: tuple[str, list[tuple[str, int]]]) -> None:
    url, peers = server
    client = HttpClient(url, max_connections=3)
    replies = await asyncio.gather(*(client.post("/echo", str(i).encode()) for i in range(30)))
    await client.aclose()
    assert sorted(int(r.json()["body"]) for r in replies) == list(range(30))
    assert len(set(peers)) <= 3


async def test_tls_with_the_stacks_ca(tmp_path: Path) -> None:
    tls = write_serving_certificate(tmp_path / "tls")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(str(tls.cert), str(tls.key))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret")
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = srv.sockets[0].getsockname()[1]
    trusted = HttpClient(f"https://127.0.0.1:{port}", ssl_context=ssl.create_default_context(cafile=str(tls.ca)))
    untrusted = HttpClient(f"https://127.0.0.1:{port}")
    try:
        assert (await trusted.get("/")).body == b"secret"
        with pytest.raises(HttpError):
            await untrusted.get("/")
    finally:
        await trusted.aclose()
        await untrusted.aclose()
        srv.close()


async def test_a_connection_the_server_closes_is_not_reused() -> None:
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    srv, port = await _raw_server(handle)
    client = HttpClient(f"http://127.0.0.1:{port}")
    try:
        assert [(await client.get("/")).body for _ in range(3)] == [b"ok"] * 3
        assert connections == 3
    finally:
        await client.aclose()
        srv.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 2",
    ],
)
async def test_a_malformed_or_truncated_reply_is_an_http_error(answer: bytes) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    srv, port = await _raw_server(handle)
    client = HttpClient(f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(HttpError, match="GET /"):
            await client.get("/")
    finally:
        await client.aclose()
        srv.close()


async def test_no_server_and_no_reply_are_http_errors() -> None:
    sock = bind_loopback()
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(HttpError):
        await HttpClient(f"http://127.0.0.1:{port}").get("/")

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    srv, port = await _raw_server(silent)
    client = HttpClient(f"http://127.0.0.1:{port}", timeout=0.2)
    try:
        with pytest.raises(HttpError, match="no reply within"):
            await client.get("/")
    finally:
        await client.aclose()
        srv.close()


def test_only_http_urls() -> None:
    with pytest.raises(ValueError, match="not an http"):
        HttpClient("ftp://example")
