"""``hami-extender``: serve the extender API until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import ssl
import sys
from collections.abc import Sequence
from typing import Any, Final

import uvicorn
from starlette.types import Receive, Scope, Send

from hami_common import service
from hami_common.connections import ConnectionLimits, GuardedConfig, GuardedServer
from hami_extender import paths
from hami_extender.app import create_app
from hami_extender.settings import ExtenderSettings

__all__ = ["main", "serve"]

SWITCH_INTERVAL_S: Final = 0.0005
_PROBE_HEADERS: Final = [(b"content-length", b"0"), (b"connection", b"close")]
_PROBE_HEAD_BYTES: Final = 8 * 1024  # a probe's request head is a few hundred bytes

log = logging.getLogger(__name__)


async def _answer_probe(scope: Scope, receive: Receive, send: Send) -> None:
    """The probe port's whole app: ``GET /healthz`` gets 200 (the event loop answers, as the API's /healthz
    says), anything else 404. Nothing else is served here, so this port may listen where the API must not."""
    if scope["type"] != "http":
        return
    found = (scope["method"], scope["path"]) == ("GET", paths.HEALTHZ)
    await send({"type": "http.response.start", "status": 200 if found else 404, "headers": _PROBE_HEADERS})
    await send({"type": "http.response.body", "body": b""})


def _probe_server(settings: ExtenderSettings) -> GuardedServer:
    """The kubelet's plain port, under the webhook's connection guard (issue 28 item 4): it listens on the
    pod's address, where any neighbour can open connections and never finish a request."""
    limits = ConnectionLimits(
        max_connections=settings.health_max_connections,
        read_timeout=settings.health_read_timeout,
        keep_alive_timeout=1.0,  # every answer says Connection: close
        max_header_bytes=_PROBE_HEAD_BYTES,
    )
    config = GuardedConfig(
        _answer_probe,
        limits=limits,
        name="extender probe",
        host=settings.health_host,  # empty: every address
        port=settings.health_port,
        log_config=None,
        access_log=False,
        lifespan="off",
        proxy_headers=False,
        server_header=False,
        date_header=False,
    )
    return GuardedServer(config)


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
    probes = _probe_server(settings) if settings.health_port else None
    async with asyncio.TaskGroup() as tg:
        serving = {tg.create_task(server.serve(), name="http")}
        if probes is not None:
            serving.add(tg.create_task(probes.serve(), name="probes"))
            log.info("kubelet probes answered on port %d", settings.health_port)
        stopping = tg.create_task(stop.wait(), name="stop")
        await asyncio.wait({*serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        if probes is not None:
            probes.should_exit = True
        stopping.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(ExtenderSettings, serve, argv, name="hami-extender")
