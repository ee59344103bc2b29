"""``hami-webhook``: the mutating admission webhook service."""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Sequence

from hami_common import service
from hami_webhook.app import create_app
from hami_webhook.server import serve
from hami_webhook.settings import WebhookSettings

__all__ = ["main"]

log = logging.getLogger(__name__)


async def _run(settings: WebhookSettings, stop: asyncio.Event) -> None:
    await serve(create_app(settings), settings, stop)


def _use_uvloop_if_installed() -> None:
    """uvloop's TLS and I/O cost a fraction of asyncio's; uvicorn picks httptools by itself the same way."""
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: Sequence[str] | None = None) -> int:
    _use_uvloop_if_installed()
    return service.run(WebhookSettings, _run, argv, name="hami-webhook")


if __name__ == "__main__":
    raise SystemExit(main())
