"""Serving the app with uvicorn over TLS, the certificate reloaded when its files change.

Connections are bounded by :mod:`hami_common.connections` (read deadline, header budget, a cap).
uvicorn builds its own SSL context from file names once; the webhook instead hands it the
:class:`~hami_webhook.tls.ReloadingCertificate`'s context, which a watcher task refreshes. Signals belong
to :mod:`hami_common.service`, which sets ``stop``; uvicorn's own signal capture is switched off.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from fastapi import FastAPI

from hami_common.connections import GuardedConfig, GuardedServer
from hami_common.mtls import require_client_certificates
from hami_webhook.settings import WebhookSettings
from hami_webhook.tls import ReloadingCertificate

__all__ = ["WebhookServer", "serve"]


class WebhookServer(GuardedServer):
    """uvicorn without its signal handlers: the service's ``stop`` event ends it; at shutdown the connections
    still in their TLS handshake are dropped first (uvicorn never saw them)."""


def _config(app: FastAPI, settings: WebhookSettings) -> tuple[GuardedConfig, ReloadingCertificate | None]:
    config = GuardedConfig(
        app,
        limits=settings.connection_limits(),
        name="webhook",
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        proxy_headers=False,  # the apiserver connects directly; no X-Forwarded-* to trust
        server_header=False,  # two headers fewer to build and validate on every answer
        date_header=False,
    )
    config.load()
    cert = None
    client_ca = settings.client_ca(serving_tls=bool(settings.tls_cert_file))
    if settings.tls_cert_file:
        key = Path(settings.tls_key_file) if settings.tls_key_file else None
        cert = ReloadingCertificate(Path(settings.tls_cert_file), key)
        if client_ca:
            # only kube-apiserver's client certificate passes the handshake (issue 28 item 9; docs/deploy.md)
            require_client_certificates(cert.context, client_ca)
        config.tls = cert.context  # each connection's handshake is the guard's (hami_common.connections)
    return config, cert


async def serve(
    app: FastAPI, settings: WebhookSettings, stop: asyncio.Event, sock: socket.socket | None = None
) -> None:
    """Serve until ``stop`` is set (or the server ends by itself); ``sock``: an already bound socket."""
    config, cert = _config(app, settings)
    server = WebhookServer(config)
    async with asyncio.TaskGroup() as tg:
        serving = tg.create_task(server.serve(sockets=None if sock is None else [sock]), name="uvicorn")
        stopping = tg.create_task(stop.wait(), name="stop")
        watching = None
        if cert is not None:
            watching = tg.create_task(cert.watch(settings.tls_reload_seconds), name="certificate watch")
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        stopping.cancel()
        if watching is not None:
            watching.cancel()
