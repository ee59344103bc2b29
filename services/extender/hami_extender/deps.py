"""Dependencies of the HTTP handlers: the objects the lifespan built, reached through ``request.state``.

They are ``async`` on purpose: FastAPI runs a plain-function dependency in a worker thread."""

from __future__ import annotations

from typing import Annotated, TypedDict

from fastapi import Depends, Request

from hami_extender.binder import Binder
from hami_extender.handshake import NodeHandshakes
from hami_extender.leadership import Leadership
from hami_extender.ledger import Ledger
from hami_extender.placer import Placer
from hami_extender.preemptor import Preemptor
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
]


class State(TypedDict):
    settings: ExtenderSettings
    ledger: Ledger
    placer: Placer
    binder: Binder
    preemptor: Preemptor
    leadership: Leadership
    publisher: PlacementPublisher
    readiness: Readiness
    handshakes: NodeHandshakes


async def get_settings(request: Request) -> ExtenderSettings:
    settings: ExtenderSettings = request.state.settings
    return settings


async def get_ledger(request: Request) -> Ledger:
    ledger: Ledger = request.state.ledger
    return ledger


async def get_placer(request: Request) -> Placer:
    placer: Placer = request.state.placer
    return placer


async def get_binder(request: Request) -> Binder:
    binder: Binder = request.state.binder
    return binder


async def get_leadership(request: Request) -> Leadership:
    leadership: Leadership = request.state.leadership
    return leadership


async def get_publisher(request: Request) -> PlacementPublisher:
    publisher: PlacementPublisher = request.state.publisher
    return publisher


async def get_readiness(request: Request) -> Readiness:
    readiness: Readiness = request.state.readiness
    return readiness


SettingsDep = Annotated[ExtenderSettings, Depends(get_settings)]
LedgerDep = Annotated[Ledger, Depends(get_ledger)]
PlacerDep = Annotated[Placer, Depends(get_placer)]
BinderDep = Annotated[Binder, Depends(get_binder)]
LeadershipDep = Annotated[Leadership, Depends(get_leadership)]
PublisherDep = Annotated[PlacementPublisher, Depends(get_publisher)]
ReadinessDep = Annotated[Readiness, Depends(get_readiness)]
