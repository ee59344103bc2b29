"""A lean HTTP/1.1 client for the emulated Go peers: kube-apiserver's webhook calls, kube-scheduler's extender calls.

The peers this library stands in for are Go programs whose HTTP clients cost next to nothing. A general
Python client (httpx) spends more CPU per request than the service it calls, and the local stack runs
everything in one process on two cores, so the stand-ins would measure themselves rather than our services.
This one does only what those peers do: keep-alive connections from a bounded pool, a request with a body
and a ``Content-Length``, a reply with a ``Content-Length`` or chunked body, TLS through an ``ssl`` context.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import msgspec

__all__ = ["HttpClient", "HttpError", "HttpReply"]

_IDLE_S: Final = 4.0  # under uvicorn's 5 s keep-alive timeout: a pooled connection is never one the server closed
_NO_BODY: Final = frozenset({204, 304})


class HttpError(Exception):
    """The exchange failed: no connection, a reset, a timeout or a reply that is not HTTP/1.1."""


@dataclass(frozen=True, slots=True)
class HttpReply:
    status: int
    headers: Mapping[str, str]  # names in lower case
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


@dataclass(slots=True)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0

    def usable(self, now: float) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing() and now - self.idle_since < _IDLE_S

    def close(self) -> None:
        self.writer.close()


class HttpClient:
    """``await client.request("POST", "/filter", body)``; at most ``max_connections`` exchanges at once."""

    def __init__(
        self,
        base_url: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        max_connections: int = 64,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self._tls = (ssl_context or ssl.create_default_context()) if url.scheme == "https" else None
        self._prefix = url.path.rstrip("/")
        authority = url.netloc.rpartition("@")[2]
        fixed = {"Host": authority, **(headers or {})}
        self._fixed = "".join(f"{name}: {value}\r\n" for name, value in fixed.items())
        self.timeout = timeout
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> HttpReply:
        async with self._slots:
            if self._closed:
                raise HttpError("the client is closed")
            conn: _Connection | None = None
            try:
                async with asyncio.timeout(self.timeout):
                    conn = await self._connection()
                    conn.writer.write(self._head(method, path, body, headers) + body)
                    reply, keep = await _read_reply(conn.reader, method)
            except TimeoutError as err:
                if conn is not None:
                    conn.close()
                raise HttpError(f"{method} {path}: no reply within {self.timeout:g}s") from err
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as err:
                if conn is not None:
                    conn.close()
                raise HttpError(f"{method} {path}: {err or type(err).__name__}") from err
            assert conn is not None  # the exchange succeeded on it
            if keep and not self._closed:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
            else:
                conn.close()
            return reply

    async def get(self, path: str, headers: Mapping[str, str] | None = None) -> HttpReply:
        return await self.request("GET", path, b"", headers)

    async def post(self, path: str, body: bytes, headers: Mapping[str, str] | None = None) -> HttpReply:
        return await self.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _head(self, method: str, path: str, body: bytes, headers: Mapping[str, str] | None) -> bytes:
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        length = f"Content-Length: {len(body)}\r\n" if body or method in ("POST", "PUT", "PATCH") else ""
        return f"{method} {self._prefix}{path} HTTP/1.1\r\n{self._fixed}{extra}{length}\r\n".encode("latin-1")

    async def _connection(self) -> _Connection:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable(now):
                return conn
            conn.close()
        server_hostname = self.host if self._tls is not None else None
        reader, writer = await asyncio.open_connection(
            self.host, self.port, ssl=self._tls, server_hostname=server_hostname
        )
        return _Connection(reader, writer)


async def _read_reply(reader: asyncio.StreamReader, method: str) -> tuple[HttpReply, bool]:
    """One reply off the stream, and whether the connection may carry another request."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x reply: {lines[0][:60]!r}")
    status = int(rest[:3])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"malformed header line {line[:60]!r}")
        headers[name.strip().lower()] = value.strip()
    keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    if method == "HEAD" or status in _NO_BODY or 100 <= status < 200:
        body = b""
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:  # the body runs to the end of the connection
        body, keep = await reader.read(), False
    return HttpReply(status, headers, body), keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, then the blank line
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
