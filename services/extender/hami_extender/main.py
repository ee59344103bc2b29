"""``hami-extender``: serve the extender API until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import Final

import uvicorn

from hami_common import service
from hami_extender.app import create_app
from hami_extender.settings import ExtenderSettings

__all__ = ["main", "serve"]

SWITCH_INTERVAL_S: Final = 0.0005


async def serve(settings: ExtenderSettings, stop: asyncio.Event) -> None:
    # The kube client's blocking calls and watch readers run in threads; a short switch interval keeps
    # them from holding the GIL for 5 ms while a /filter request waits on the event loop.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    tls = bool(settings.tls_cert_file and settings.tls_key_file)
    config = uvicorn.Config(
        create_app(settings),
        host=settings.http_host,
        port=settings.http_port,
        ssl_certfile=settings.tls_cert_file if tls else None,
        ssl_keyfile=settings.tls_key_file if tls else None,
        log_config=None,
        access_log=False,
        timeout_keep_alive=30,
        h11_max_incomplete_event_size=64 * 1024,
    )
    server = uvicorn.Server(config)
    async with asyncio.TaskGroup() as tg:
        serving = tg.create_task(server.serve(), name="http")
        stopping = tg.create_task(stop.wait(), name="stop")
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        stopping.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(ExtenderSettings, serve, argv, name="hami-extender")
