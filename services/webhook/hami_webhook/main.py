"""``hami-webhook``: the mutating admission webhook service."""

from __future__ import annotations

import asyncio
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


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(WebhookSettings, _run, argv, name="hami-webhook")


if __name__ == "__main__":
    raise SystemExit(main())
