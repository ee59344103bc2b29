"""``GET /healthz`` (the process answers) and ``GET /readyz`` (the caches have listed once)."""

from __future__ import annotations

from typing import Final

from fastapi import APIRouter, Response

from hami_webhook.deps import ReadyDep
from hami_webhook.routes import paths

__all__ = ["router"]

HTTP_OK: Final = 200
HTTP_UNAVAILABLE: Final = 503

router = APIRouter()


@router.get(paths.HEALTHZ)
async def healthz() -> Response:
    return Response(status_code=HTTP_OK)


@router.get(paths.READYZ)
async def readyz(ready: ReadyDep) -> Response:
    return Response(status_code=HTTP_OK if ready() else HTTP_UNAVAILABLE)
