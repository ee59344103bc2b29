"""``GET /healthz`` (always 200, empty, like HAMi) and ``GET /readyz`` (200, says who leads)."""

from __future__ import annotations

import msgspec
from fastapi import APIRouter, Response

from hami_extender import paths
from hami_extender.deps import LeadershipDep, LedgerDep, PublisherDep, ReadinessDep

__all__ = ["router"]

router = APIRouter()


class Ready(msgspec.Struct, frozen=True, kw_only=True):
    leader: bool
    identity: str
    synced: bool
    nodes: int
    placements_published: int
    placements_unpublished: int


@router.get(paths.HEALTHZ)
async def healthz() -> Response:
    return Response(status_code=200)


@router.get(paths.READYZ)
async def readyz(
    leadership: LeadershipDep, ready: ReadinessDep, ledger: LedgerDep, publisher: PublisherDep
) -> Response:
    body = Ready(
        leader=leadership.leading,
        identity=leadership.identity,
        synced=ready.synced,
        nodes=sum(1 for _ in ledger.views()),
        placements_published=publisher.published,
        placements_unpublished=publisher.failed,
    )
    return Response(msgspec.json.encode(body), media_type="application/json")
