"""``Bus``: one NATS connection with typed publish and subscribe, trace context in headers.

Every handler goes through :meth:`Bus._dispatch`, the one edge adapter for the bus: a message that
does not decode is logged once, counted and dropped (``term`` on JetStream, never redelivered); a
handler's ``TransientError`` becomes ``nak(delay)``; ``InvalidInput`` becomes ``term``; any other error is
logged with its traceback, counted and nak'ed. Handlers never need to catch broadly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Final, TypeVar

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.js import api as js_api
from opentelemetry.context import Context

from hami_common import spans, subjects
from hami_common.bus._streams import ConsumerSpec, StreamSpec
from hami_common.errors import InvalidInput, TransientError
from hami_common.settings import BusSettings
from hami_common.tracing import context_from_headers, inject_headers, span_from_headers

__all__ = ["Bus", "BusStats", "Delivery", "Handler", "Subscription"]

log = logging.getLogger(__name__)

E = TypeVar("E", bound=msgspec.Struct)
MSG_ID_HEADER: Final = "Nats-Msg-Id"
_FETCH_WAIT_S: Final = 1.0
_CONNECT_BACKOFF_MAX_S: Final = 2.0
_REQUEST_TIMEOUT_S: Final = 5.0
_SYNC_TIMEOUT_S: Final = 5  # seconds for each PONG of sync()


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a handler may want to know about the message besides its body."""

    subject: str
    headers: dict[str, str]
    deliveries: int  # 1 on first delivery; more when JetStream redelivers

    @property
    def context(self) -> Context:
        return context_from_headers(self.headers)


Handler = Callable[[E, Delivery], Awaitable[None]]


@dataclass(slots=True)
class BusStats:
    """Counts per outcome; a service exports them (the metrics issue) or a test reads them."""

    counts: Counter[str] = field(default_factory=Counter)

    def add(self, outcome: str) -> None:
        self.counts[outcome] += 1

    @property
    def malformed(self) -> int:
        return self.counts["malformed"]

    @property
    def handled(self) -> int:
        return self.counts["handled"]


class Subscription:
    """A running subscription; :meth:`stop` ends it without deleting a durable consumer."""

    def __init__(self, subject: str, task: asyncio.Task[None] | None, sub: NatsSubscription | None) -> None:
        self.subject = subject
        self._task = task
        self._sub = sub

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()


class Bus:
    """One connection to NATS. Open with :meth:`connect`; use as an async context manager to drain."""

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc
        self._js = nc.jetstream(timeout=_REQUEST_TIMEOUT_S)
        self._subs: list[Subscription] = []
        self.stats = BusStats()

    # --- connection ---------------------------------------------------------------------------------
    @classmethod
    async def connect(cls, settings: BusSettings, *, give_up_after: float = 30.0) -> Bus:
        """Connect, retrying with backoff for ``give_up_after`` seconds; afterwards nats-py reconnects forever."""
        servers = [s.strip() for s in settings.nats_url.split(",") if s.strip()]
        deadline = time.monotonic() + give_up_after
        delay = 0.05
        while True:
            remaining = deadline - time.monotonic()
            try:
                # nats-py retries an unreachable server forever when reconnects are unlimited: bound it.
                async with asyncio.timeout(max(remaining, 0.01)):
                    nc = await nats.connect(
                        servers=servers,
                        name=settings.service_name,
                        user=settings.nats_user or None,
                        password=settings.nats_password or None,
                        token=_token_reader(settings.nats_token_file) if settings.nats_token_file else None,
                        user_credentials=settings.nats_creds or None,
                        tls=_tls_context(settings.nats_ca_file) if settings.nats_ca_file else None,
                        inbox_prefix=(
                            subjects.inbox_prefix(settings.nats_identity) if settings.nats_identity else "_INBOX"
                        ),
                        connect_timeout=max(1, round(settings.nats_connect_timeout)),
                        allow_reconnect=True,
                        max_reconnect_attempts=-1,
                        reconnect_time_wait=0.25,
                        error_cb=_log_error,
                        disconnected_cb=_log_disconnected,
                        reconnected_cb=_log_reconnected,
                    )
                return cls(nc)
            except (OSError, nats.errors.Error, TimeoutError) as err:
                if time.monotonic() + delay > deadline:
                    raise TransientError(f"cannot reach NATS at {settings.nats_url}: {err!r}") from err
                log.info("NATS not reachable yet (%s); retrying in %.2fs", err, delay)
                await asyncio.sleep(delay)  # backoff between connection attempts, not a test sleep
                delay = min(delay * 2, _CONNECT_BACKOFF_MAX_S)

    @property
    def connected(self) -> bool:
        return bool(self._nc.is_connected)

    @property
    def closed(self) -> bool:
        """Closed for good: drained, or given up by nats-py (which does not reconnect a closed connection)."""
        return bool(self._nc.is_closed)

    @property
    def connected_url(self) -> str:
        """The server this connection is on now (one of a cluster's), empty while disconnected."""
        url = self._nc.connected_url
        return url.geturl() if url is not None and self.connected else ""

    async def stream_replicas(self, name: str) -> int:
        """How many copies of the stream the server keeps (its configuration as stored)."""
        try:
            info = await self._js.stream_info(name)
        except (nats.errors.Error, TimeoutError) as err:
            raise TransientError(f"stream {name}: {err}") from err
        return int(info.config.num_replicas or 1)

    async def sync(self) -> None:
        """Return once the server has everything sent so far (subscriptions included).

        nats-py's ``flush()`` writes its PING ahead of commands still in the client's pending buffer, so one
        flush can return before an earlier SUB or PUB reached the server: a subscriber that flushed could
        still miss the next message (seen under load). The first flush gets the buffer written; the second
        PING follows it on the wire, so its PONG vouches for everything before. Raises TransientError when
        the server does not answer.
        """
        try:
            await self._nc.flush(timeout=_SYNC_TIMEOUT_S)
            await self._nc.flush(timeout=_SYNC_TIMEOUT_S)
        except (nats.errors.Error, TimeoutError) as err:
            raise TransientError(f"NATS did not confirm what was sent: {err}") from err

    async def drain(self) -> None:
        """Stop every subscription, flush what was published, close."""
        for sub in self._subs:
            await sub.stop()
        self._subs.clear()
        if not self._nc.is_closed:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await self._nc.drain()

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.drain()

    # --- declarations -------------------------------------------------------------------------------
    async def ensure_stream(self, spec: StreamSpec) -> None:
        """Create the stream, or bring an existing one to this configuration; safe to call from many."""
        config = js_api.StreamConfig(
            name=spec.name,
            subjects=list(spec.subjects),
            storage=js_api.StorageType.FILE,
            retention=js_api.RetentionPolicy.LIMITS,
            max_age=spec.max_age_s,
            duplicate_window=spec.duplicate_window_s,
            num_replicas=spec.replicas,
        )
        try:
            try:
                await self._js.stream_info(spec.name)
            except nats.js.errors.NotFoundError:
                try:
                    await self._js.add_stream(config)
                    return
                except nats.js.errors.BadRequestError:
                    pass  # created by someone else between our two calls: fall through to update
            await self._js.update_stream(config)
        except (nats.errors.Error, TimeoutError) as err:  # e.g. a cluster still electing its JetStream leader
            raise TransientError(f"stream {spec.name} not declared: {err}") from err

    async def ensure_consumer(self, stream: str, spec: ConsumerSpec) -> None:
        """Create or update a durable pull consumer; its position survives every restart."""
        await self._js.add_consumer(
            stream,
            js_api.ConsumerConfig(
                # With a name, nats-py sends CONSUMER.CREATE.<stream>.<name>.<filter>, and the server refuses a
                # config whose filter is not the one in the subject: a user allowed to create only that subject
                # cannot point its consumer at another node's placements (DURABLE.CREATE would let it).
                name=spec.durable,
                durable_name=spec.durable,
                filter_subject=spec.filter_subject,
                ack_policy=js_api.AckPolicy.EXPLICIT,
                deliver_policy=js_api.DeliverPolicy.ALL,
                ack_wait=spec.ack_wait_s,
                max_deliver=spec.max_deliver,
                max_ack_pending=spec.max_ack_pending,
            ),
        )

    # --- publishing ---------------------------------------------------------------------------------
    async def publish(self, subject: str, event: msgspec.Struct, *, ctx: Context | None = None) -> None:
        """Fire-and-forget on core NATS, with the current (or given) trace context."""
        headers: dict[str, str] = {}
        inject_headers(headers, ctx)
        try:
            await self._nc.publish(subject, msgspec.msgpack.encode(event), headers=headers or None)
        except nats.errors.Error as err:
            # nats-py closes a connection for good on the server's -ERR (an authorization refused while it
            # reconnected under load, say): the caller's to retry or drop, never an unhandled crash
            raise TransientError(f"NATS publish on {subject} failed: {err}") from err

    async def publish_durable(
        self, subject: str, event: msgspec.Struct, *, msg_id: str | None = None, ctx: Context | None = None
    ) -> int:
        """Store in JetStream and return the stream sequence; ``msg_id`` makes a retry a no-op."""
        headers: dict[str, str] = {}
        inject_headers(headers, ctx)
        if msg_id:
            headers[MSG_ID_HEADER] = msg_id
        try:
            ack = await self._js.publish(
                subject, msgspec.msgpack.encode(event), headers=headers, timeout=_REQUEST_TIMEOUT_S
            )
        except (nats.errors.Error, TimeoutError) as err:
            # timeouts, no responders, a closed connection, and in a cluster failing over "no response from
            # stream": all worth a retry, which the message ID makes safe
            raise TransientError(f"JetStream publish on {subject} failed: {err}") from err
        return int(ack.seq)

    # --- consuming ----------------------------------------------------------------------------------
    async def subscribe(
        self, subject: str, event_type: type[E], handler: Handler[E], *, queue: str = ""
    ) -> Subscription:
        """Core NATS: messages published while nobody listens are gone (use :meth:`consume` for those)."""
        decoder = msgspec.msgpack.Decoder(event_type)

        async def on_message(msg: Msg) -> None:
            await self._dispatch(msg, decoder, handler, durable=False)

        sub = await self._nc.subscribe(subject, queue=queue, cb=on_message)
        wrapped = Subscription(subject, None, sub)
        self._subs.append(wrapped)
        if self.connected:  # live when this returns; while disconnected, nats-py subscribes on reconnect
            try:
                await self.sync()
            except TransientError as err:  # kept all the same: nats-py sends the SUB again on reconnect
                log.warning("subscription to %s not confirmed yet: %s", subject, err)
        return wrapped

    async def reply(self, subject: str, answer: Callable[[bytes], Awaitable[bytes | None]]) -> Subscription:
        """Core NATS request/reply on raw bytes (a protocol that is not ours, e.g. nats-server's auth callout):
        ``answer`` returns the reply, or None to send none; an error it raises is logged and counted, and the
        subscription keeps serving."""

        async def on_request(msg: Msg) -> None:
            self.stats.add("received")
            try:
                body = await answer(msg.data)
            except Exception:  # the edge of a foreign protocol: one bad request must not stop the service
                log.exception("answering a request on %s failed", msg.subject)
                self.stats.add("failed")
                return
            if body is None:
                self.stats.add("rejected")
                return
            self.stats.add("handled")
            if msg.reply:
                await self._nc.publish(msg.reply, body)

        sub = await self._nc.subscribe(subject, cb=on_request)
        wrapped = Subscription(subject, None, sub)
        self._subs.append(wrapped)
        await self.sync()
        return wrapped

    async def consume(
        self, stream: str, spec: ConsumerSpec, event_type: type[E], handler: Handler[E], *, batch: int = 32
    ) -> Subscription:
        """Run a durable pull consumer: at-least-once, acknowledged only after the handler returns."""
        await self.ensure_consumer(stream, spec)
        psub = await self._js.pull_subscribe_bind(durable=spec.durable, stream=stream)
        decoder = msgspec.msgpack.Decoder(event_type)

        async def pump() -> None:
            while True:
                try:
                    msgs = await psub.fetch(batch, timeout=_FETCH_WAIT_S)
                except (nats.errors.TimeoutError, TimeoutError):
                    continue  # nothing new: fetch again
                except nats.errors.Error as err:  # disconnected, server restarting
                    log.info("consumer %s waiting for NATS: %s", spec.durable, err)
                    await asyncio.sleep(_FETCH_WAIT_S / 4)
                    continue
                for msg in msgs:
                    await self._dispatch(msg, decoder, handler, durable=True)

        task = asyncio.create_task(pump(), name=f"consume:{spec.durable}")
        wrapped = Subscription(spec.filter_subject, task, None)
        self._subs.append(wrapped)
        return wrapped

    async def _dispatch(
        self, msg: Msg, decoder: msgspec.msgpack.Decoder[E], handler: Handler[E], *, durable: bool
    ) -> None:
        self.stats.add("received")
        try:
            event = decoder.decode(msg.data)
        except msgspec.DecodeError as err:
            log.warning("dropping malformed message on %s: %s", msg.subject, err)
            self.stats.add("malformed")
            if durable:
                await _settle(msg.term())
            return
        headers = dict(msg.headers or {})
        deliveries = msg.metadata.num_delivered if durable and msg.metadata.num_delivered else 1
        delivery = Delivery(subject=msg.subject, headers=headers, deliveries=deliveries)
        try:
            with span_from_headers(
                spans.consume(msg.subject), headers, attributes=spans.consume_attributes(msg.subject)
            ):
                await handler(event, delivery)
        except TransientError as err:
            log.info("handler on %s will retry in %.1fs: %s", msg.subject, err.retry_after, err)
            self.stats.add("retried")
            if durable:
                await _settle(msg.nak(delay=err.retry_after))
            return
        except InvalidInput as err:
            log.warning("handler on %s rejected a message: %s", msg.subject, err)
            self.stats.add("rejected")
            if durable:
                await _settle(msg.term())
            return
        except Exception:  # the one broad catch of the bus edge: log, count, redeliver later
            log.exception("handler on %s failed", msg.subject)
            self.stats.add("failed")
            if durable:
                await _settle(msg.nak(delay=1.0))
            return
        self.stats.add("handled")
        if durable:
            await _settle(msg.ack())


async def _settle(call: Awaitable[None]) -> None:
    """Ack/nak/term; if the connection is gone the server redelivers after ack_wait anyway."""
    try:
        await call
    except nats.errors.Error as err:
        log.info("could not settle a message (it will be redelivered): %s", err)


def _token_reader(path: str) -> Callable[[], str]:
    """The token is read at every (re)connect: the kubelet rotates a projected service-account token, and a
    reconnect hours later must present the current one, not the one the process started with."""

    def read() -> str:
        return Path(path).read_text().strip()

    read()  # a missing or unreadable file fails now, with its path, not inside nats-py's reconnect loop
    return read


def _tls_context(ca_file: str) -> ssl.SSLContext:
    """Verify the server against this CA only (never the system store: the bus has its own private CA)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


async def _log_error(err: Exception) -> None:
    log.warning("NATS error: %s", err)


async def _log_disconnected() -> None:
    log.info("NATS disconnected; reconnecting")


async def _log_reconnected() -> None:
    log.info("NATS reconnected")
