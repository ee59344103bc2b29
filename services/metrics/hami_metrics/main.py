"""``hami-metrics``: serve the aggregator with uvicorn until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import uvicorn

from hami_common import service
from hami_common.errors import TransientError
from hami_metrics.app import create_app
from hami_metrics.settings import MetricsSettings

__all__ = ["main", "serve"]


async def serve(settings: MetricsSettings, stop: asyncio.Event) -> None:
    config = uvicorn.Config(
        create_app(settings),
        host=settings.http_host,
        port=settings.http_port,
        ssl_certfile=settings.tls_cert_file or None,
        ssl_keyfile=settings.tls_key_file or None,
        log_config=None,
        access_log=False,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    async with asyncio.TaskGroup() as tasks:
        serving = tasks.create_task(server.serve(), name="uvicorn")
        stopping = tasks.create_task(stop.wait(), name="stop")
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        stopping.cancel()
    if not server.started:
        raise TransientError("the metrics server did not start (the log above says why)")


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(MetricsSettings, serve, argv, name="hami-metrics")
