"""Bounded connections: what keeps idle, half-sent or half-open connections from exhausting an HTTP listener.

Written for the webhook (issue 16 item 8, issue 28 item 4) and shared by every uvicorn listener a network
neighbour can reach (the extender's probe port too). uvicorn alone keeps a connection open for as long as its
client sends nothing, or sends a request a byte at a time: it arms its keep-alive timer only after a first
answer, and it caps nothing but the number of requests in flight (``limit_concurrency``, which answers 503 to
everyone once idle connections fill it). 8,000 half-sent TLS requests held 724 MB of the webhook, past the
pod's memory limit, and with ``failurePolicy: Fail`` that blocks every GPU pod. :class:`GuardedProtocol`
adds, per connection:

* a handshake deadline: the TLS handshake is this protocol's own (``start_tls`` on the accepted socket, not
  uvicorn's listener), so a connection counts against the cap from the moment it is accepted and must finish
  its handshake within ``handshake_timeout`` seconds; the event loop's own default is 60 s, during which
  6,000 half-open connections raised the webhook from 75 to 412 MiB, all outside the cap;
* a read deadline: a complete request (headers and body) must arrive within ``read_timeout`` seconds of the
  connection's handshake or of the previous answer, or the connection is closed;
* a header budget: a request whose headers pass ``max_header_bytes`` is answered 400 and closed;
* a connection cap shared by the server: at ``max_connections`` the oldest connection that is not being
  answered (idle, or still sending) is closed to make room, so a flood of idle clients cannot lock the
  apiserver out; only when every connection is being answered is the newcomer refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, cast

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

__all__ = [
    "HEADERS_TOO_LARGE",
    "ConnectionGuard",
    "ConnectionLimits",
    "GuardedConfig",
    "GuardedProtocol",
    "GuardedServer",
]

log = logging.getLogger(__name__)

_WARN_EVERY_S: Final = 10.0  # a flood is summarised, not logged connection by connection
HEADERS_TOO_LARGE: Final = "request headers too large"


class _Buffered(Protocol):
    def get_buffer(self, sizehint: int) -> Any: ...
    def buffer_updated(self, nbytes: int) -> None: ...


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = 1024
    read_timeout: float = 10.0
    handshake_timeout: float = 5.0
    keep_alive_timeout: float = 5.0
    max_header_bytes: int = 64 * 1024


@dataclass(eq=False)
class ConnectionGuard:
    """The server-wide side: live connections, the ones that may be evicted (oldest first), counters."""

    limits: ConnectionLimits
    name: str = "http"  # the listener, in log lines ("webhook", "extender probe")
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("refused", "evicted", "timed_out", "oversized", "handshake_failed"), 0)
    )
    _live: set[GuardedProtocol] = field(default_factory=set)
    _waiting: dict[GuardedProtocol, None] = field(default_factory=dict)  # insertion order: oldest first
    _warned_at: float = float("-inf")

    @property
    def live(self) -> int:
        return len(self._live)

    def admit(self, conn: GuardedProtocol) -> bool:
        """Register a new connection, evicting the oldest waiting one at the cap; False: refuse it."""
        if len(self._live) >= self.limits.max_connections:
            victim = next(iter(self._waiting), None)
            if victim is None:
                self.count("refused")
                return False
            self.forget(victim)
            self.count("evicted")
            victim.close("evicted")
        self._live.add(conn)
        self._waiting[conn] = None
        return True

    def serving(self, conn: GuardedProtocol) -> None:
        self._waiting.pop(conn, None)

    def waiting(self, conn: GuardedProtocol) -> None:
        if conn in self._live:
            self._waiting.pop(conn, None)
            self._waiting[conn] = None  # re-inserted: now the newest

    def forget(self, conn: GuardedProtocol) -> None:
        self._live.discard(conn)
        self._waiting.pop(conn, None)

    def drop_all(self, why: str) -> None:
        """Drop every connection nobody is being answered on (at shutdown: handshakes uvicorn never saw)."""
        for conn in list(self._waiting):
            self.forget(conn)
            conn.close(why)

    def count(self, what: str) -> None:
        self.counts[what] += 1
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "closing abusive %s connections (so far: %s; %d open, at most %d)",
                self.name,
                ", ".join(f"{k} {v}" for k, v in self.counts.items()),
                len(self._live),
                self.limits.max_connections,
            )


class GuardedConfig(uvicorn.Config):
    """uvicorn's Config serving :class:`GuardedProtocol` under ``limits``; ``tls``: the context each accepted
    connection's handshake uses (uvicorn's own ``ssl`` stays unset: the listener hands over plain sockets);
    ``name``: the listener, in log lines."""

    def __init__(
        self,
        app: Any,
        *,
        limits: ConnectionLimits,
        tls: ssl.SSLContext | None = None,
        name: str = "http",
        **kwargs: Any,
    ) -> None:
        # limit_concurrency stays unset: it counts idle connections too and would answer 503 to the apiserver
        # once idle clients filled it; the guard's cap evicts those instead.
        super().__init__(
            app,
            http=GuardedProtocol,
            timeout_keep_alive=max(1, round(limits.keep_alive_timeout)),
            h11_max_incomplete_event_size=limits.max_header_bytes,
            **kwargs,
        )
        self.guard = ConnectionGuard(limits, name)
        self.tls = tls


class GuardedServer(uvicorn.Server):
    """uvicorn's Server for a :class:`GuardedConfig`, without its signal handlers (:mod:`hami_common.service`
    owns the signals; the caller sets ``should_exit``). At shutdown it drops the connections still in their
    TLS handshake, which uvicorn never saw and would not close."""

    def __init__(self, config: GuardedConfig) -> None:
        super().__init__(config)
        self.guard = config.guard

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.guard.drop_all("shutting down")
        await super().shutdown(sockets)


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a read deadline, a header budget and a place under the cap."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        if not isinstance(config, GuardedConfig):
            raise TypeError("GuardedProtocol needs a GuardedConfig")
        self._guard = config.guard
        self._limits = config.guard.limits
        self._tls = config.tls
        self._admitted = False
        self._raw: asyncio.Transport | None = None  # the accepted socket while its handshake runs
        self._handshake: asyncio.Task[None] | None = None  # held: the loop keeps only a weak reference
        self._plain: list[bytes] = []  # bytes read before the TLS layer held the socket (the ClientHello)
        self._early: list[bytes] = []  # data that came with the handshake's last flight, before uvicorn's side
        self._http = False  # uvicorn's side of the connection started
        self._deadline: asyncio.TimerHandle | None = None
        self._headers_done = False
        self._header_bytes = 0
        self._chunk = 0  # length of the data being parsed
        self._in_flight = 0  # requests read whole and not yet answered (more than one only when pipelined)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if not self._guard.admit(self):
            transport.abort()
            return
        self._admitted = True
        if self._tls is None or transport.get_extra_info("sslcontext") is not None:
            self._begin_http(transport)
            return
        self._raw = transport
        self._arm(self._limits.handshake_timeout)
        self._handshake = self.loop.create_task(self._secure(transport, self._tls))

    async def _secure(self, raw: asyncio.Transport, tls: ssl.SSLContext) -> None:
        starting = asyncio.ensure_future(
            self.loop.start_tls(raw, self, tls, server_side=True, ssl_handshake_timeout=self._limits.handshake_timeout)
        )
        try:
            # uvloop starts reading an accepted socket once connection_made returns, whatever it was told
            # there, so the ClientHello may already have come to this protocol. Two turns of the loop: start_tls
            # has handed the socket to its TLS layer, and that layer has started; it gets those bytes first.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            self._hand_over(raw)
            secured = await starting
        except (OSError, RuntimeError) as err:  # a peer that never finished TLS (SSLError, TimeoutError too)
            self._handshake_failed(raw, err)
            return
        except asyncio.CancelledError:
            starting.cancel()
            raise
        if secured is None or secured.is_closing() or self._raw is None:
            # dropped during the handshake (evicted, timed out, or the peer left): a loop may still answer
            # with the dead connection's transport, which uvicorn must never take as a live one
            self._handshake_failed(raw, ConnectionAbortedError("closed during the handshake"))
            return
        self._raw = self._handshake = None
        self._begin_http(secured)

    def _hand_over(self, raw: asyncio.Transport) -> None:
        """The bytes read before the TLS layer held the socket, to that layer (a BufferedProtocol)."""
        pending, self._plain = b"".join(self._plain), []
        layer = raw.get_protocol()
        # both loops' TLS layers are buffered protocols (uvloop's is not registered as asyncio's ABC)
        if not pending or layer is self or raw.is_closing() or not hasattr(layer, "get_buffer"):
            return
        tls_layer = cast(_Buffered, layer)
        view = memoryview(pending)
        while view:
            buffer = memoryview(tls_layer.get_buffer(len(view)))
            size = min(len(buffer), len(view))
            buffer[:size] = view[:size]
            tls_layer.buffer_updated(size)
            view = view[size:]

    def _handshake_failed(self, raw: asyncio.Transport, err: BaseException) -> None:
        self._disarm()
        self._raw = self._handshake = None
        self._early, self._plain = [], []
        if self._admitted:
            self._guard.forget(self)
            self._admitted = False
            self._guard.count("handshake_failed")
            log.debug("%s TLS handshake failed: %s", self._guard.name, err)
        raw.abort()

    def _begin_http(self, transport: asyncio.Transport) -> None:
        """uvicorn's side of the connection, from here on over ``transport`` (TLS where it was started)."""
        super().connection_made(transport)
        self._http = True
        self._arm()
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._guard.forget(self)
        if self._http:  # uvicorn's side was started (not refused, not lost in the handshake)
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._raw is not None and self._raw.get_protocol() is self:  # TLS not yet started (see _secure)
            self._plain.append(data)
            return
        if not self._http:  # delivered before start_tls returned: uvicorn's side is not started yet
            self._early.append(data)
            return
        self._chunk = len(data)
        if not self._headers_done:
            self._header_bytes += len(data)
        super().data_received(data)
        too_large = not self._headers_done and self._header_bytes > self._limits.max_header_bytes
        if too_large and not self.transport.is_closing():
            self._guard.count("oversized")
            self.send_400_response(HEADERS_TOO_LARGE)

    # httptools parser callbacks

    def on_message_begin(self) -> None:
        self._headers_done = False
        self._header_bytes = self._chunk  # the head starts in the chunk being parsed: count all of it
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._headers_done = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()  # the request is in: answering it is the app's business, not the client's
        self._in_flight += 1
        self._guard.serving(self)
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._in_flight = max(0, self._in_flight - 1)
        if self._in_flight == 0 and not self.transport.is_closing():
            self._headers_done = False
            self._header_bytes = 0
            self._guard.waiting(self)
            self._arm()

    # the deadline

    def _arm(self, seconds: float | None = None) -> None:
        self._disarm()
        timeout = self._limits.read_timeout if seconds is None else seconds
        self._deadline = self.loop.call_later(timeout, self._on_deadline)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _on_deadline(self) -> None:
        self._deadline = None
        transport = self._raw if self._raw is not None else self.transport
        if transport is not None and not transport.is_closing():
            self._guard.count("timed_out")
            self.close("timed out")

    def close(self, why: str) -> None:
        """Drop this connection (timed out, or evicted to make room).

        Aborted, not closed: a TLS close waits for the peer's close_notify (up to 30 s), and a client that
        stopped reading would keep the socket and its buffers for that long.
        """
        self._disarm()
        if self._raw is not None:  # still in its handshake: uvicorn never saw it
            raw, self._raw = self._raw, None
            self._guard.forget(self)
            self._admitted = False  # counted here (evicted, timed out), not again as a failed handshake
            log.debug("dropping a %s connection in its TLS handshake: %s", self._guard.name, why)
            raw.abort()
            return
        if self.transport is not None and not self.transport.is_closing():
            log.debug("dropping %s connection from %s: %s", self._guard.name, self.client, why)
            self.transport.abort()
