"""``hami-extender``: serve the extender API until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import ssl
import sys
from collections.abc import Sequence
from typing import Any, Final

import uvicorn

from hami_common import service
from hami_extender import paths
from hami_extender.app import create_app
from hami_extender.settings import ExtenderSettings

__all__ = ["main", "serve"]

SWITCH_INTERVAL_S: Final = 0.0005
_PROBE_READ_S: Final = 5.0  # a probe connection that sends no request within this long is closed
_PROBE_OK: Final = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_PROBE_NOT_FOUND: Final = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

log = logging.getLogger(__name__)


async def _answer_probe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One kubelet probe: ``GET /healthz`` gets 200 (the event loop answers, as the API's /healthz says),
    anything else 404. Nothing else is served here, so this port may listen where the API must not."""
    try:
        async with asyncio.timeout(_PROBE_READ_S):
            request = await reader.readline()
            while (await reader.readline()).strip():
                pass  # the headers: nothing in them matters
        method, _, rest = request.partition(b" ")
        path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
        writer.write(_PROBE_OK if (method, path) == (b"GET", paths.HEALTHZ.encode()) else _PROBE_NOT_FOUND)
        await writer.drain()
    except (TimeoutError, OSError, ValueError):
        pass  # a probe that went away or sent a line beyond the reader's limit: nothing to answer
    finally:
        writer.close()


def _uvicorn_tls(settings: ExtenderSettings) -> dict[str, Any]:
    """uvicorn's TLS options: HTTPS with a certificate and key; mutual TLS with a client CA as well."""
    tls = bool(settings.tls_cert_file and settings.tls_key_file)
    client_ca = settings.client_ca(serving_tls=tls)  # hami_common.mtls, as the webhook's
    if not tls:
        return {}
    options: dict[str, Any] = {"ssl_certfile": settings.tls_cert_file, "ssl_keyfile": settings.tls_key_file}
    if client_ca:
        # refused in the handshake: a caller without a certificate of this CA never reaches /bind (HAMi#3030)
        options.update(ssl_ca_certs=client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


async def serve(settings: ExtenderSettings, stop: asyncio.Event) -> None:
    # The kube client's blocking calls and watch readers run in threads; a short switch interval keeps
    # them from holding the GIL for 5 ms while a /filter request waits on the event loop.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    config = uvicorn.Config(
        create_app(settings),
        host=settings.http_host,
        port=settings.http_port,
        log_config=None,
        access_log=False,
        timeout_keep_alive=30,
        h11_max_incomplete_event_size=64 * 1024,
        **_uvicorn_tls(settings),
    )
    server = uvicorn.Server(config)
    probes: asyncio.Server | None = None
    if settings.health_port:
        probes = await asyncio.start_server(_answer_probe, host=settings.health_host or None, port=settings.health_port)
        log.info("kubelet probes answered on port %d", settings.health_port)
    async with asyncio.TaskGroup() as tg:
        serving = tg.create_task(server.serve(), name="http")
        stopping = tg.create_task(stop.wait(), name="stop")
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        stopping.cancel()
    if probes is not None:
        probes.close()
        await probes.wait_closed()


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(ExtenderSettings, serve, argv, name="hami-extender")
