"""Dependencies of the HTTP handlers: the objects the lifespan built, reached through ``request.state``."""

from __future__ import annotations

import hmac
from typing import Annotated, TypedDict

from fastapi import Depends, HTTPException, Request, status

from hami_extender.binder import Binder
from hami_extender.handshake import NodeHandshakes
from hami_extender.leadership import Leadership
from hami_extender.ledger import Ledger
from hami_extender.placer import Placer
from hami_extender.publisher import PlacementPublisher
from hami_extender.readiness import Readiness
from hami_extender.settings import ExtenderSettings

__all__ = [
    "BinderDep",
    "LeadershipDep",
    "LedgerDep",
    "PlacerDep",
    "PublisherDep",
    "ReadinessDep",
    "SettingsDep",
    "State",
    "require_token",
]


class State(TypedDict):
    settings: ExtenderSettings
    ledger: Ledger
    placer: Placer
    binder: Binder
    leadership: Leadership
    publisher: PlacementPublisher
    readiness: Readiness
    handshakes: NodeHandshakes


def get_settings(request: Request) -> ExtenderSettings:
    settings: ExtenderSettings = request.state.settings
    return settings


def get_ledger(request: Request) -> Ledger:
    ledger: Ledger = request.state.ledger
    return ledger


def get_placer(request: Request) -> Placer:
    placer: Placer = request.state.placer
    return placer


def get_binder(request: Request) -> Binder:
    binder: Binder = request.state.binder
    return binder


def get_leadership(request: Request) -> Leadership:
    leadership: Leadership = request.state.leadership
    return leadership


def get_publisher(request: Request) -> PlacementPublisher:
    publisher: PlacementPublisher = request.state.publisher
    return publisher


def get_readiness(request: Request) -> Readiness:
    readiness: Readiness = request.state.readiness
    return readiness


SettingsDep = Annotated[ExtenderSettings, Depends(get_settings)]
LedgerDep = Annotated[Ledger, Depends(get_ledger)]
PlacerDep = Annotated[Placer, Depends(get_placer)]
BinderDep = Annotated[Binder, Depends(get_binder)]
LeadershipDep = Annotated[Leadership, Depends(get_leadership)]
PublisherDep = Annotated[PlacementPublisher, Depends(get_publisher)]
ReadinessDep = Annotated[Readiness, Depends(get_readiness)]


def require_token(request: Request, settings: SettingsDep) -> None:
    """With ``bearer_token`` set, refuse requests without it (401); the probes stay open."""
    expected = settings.bearer_token
    if not expected:
        return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {expected}".encode()):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or wrong bearer token")
