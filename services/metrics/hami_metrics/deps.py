"""Request dependencies: what the lifespan opened, reached through ``request.state``; the /metrics guard."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request, status

from hami_common.bus import Bus
from hami_metrics.aggregator import Aggregator
from hami_metrics.exposition import BuildInfo
from hami_metrics.history import History
from hami_metrics.settings import MetricsSettings
from hami_metrics.textformat import TextRenderer

__all__ = [
    "AggregatorDep",
    "BuildDep",
    "BusDep",
    "HistoryDep",
    "RendererDep",
    "SettingsDep",
    "get_aggregator",
    "get_build",
    "get_bus",
    "get_history",
    "get_renderer",
    "get_settings",
    "require_token",
]

BEARER = "bearer"


def get_settings(request: Request) -> MetricsSettings:
    settings: MetricsSettings = request.state.settings
    return settings


def get_aggregator(request: Request) -> Aggregator:
    aggregator: Aggregator = request.state.aggregator
    return aggregator


def get_bus(request: Request) -> Bus:
    bus: Bus = request.state.bus
    return bus


def get_renderer(request: Request) -> TextRenderer:
    renderer: TextRenderer = request.state.renderer
    return renderer


def get_build(request: Request) -> BuildInfo:
    build: BuildInfo = request.state.build
    return build


def get_history(request: Request) -> History:
    history: History = request.state.history
    return history


def require_token(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """401 unless the request carries ``Authorization: Bearer <token>`` (when a token is configured)."""
    token: str = request.state.token
    if not token:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != BEARER or not secrets.compare_digest(given.strip().encode(), token.encode()):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="a valid bearer token is required",
            headers={"WWW-Authenticate": "Bearer"},
        )


SettingsDep = Annotated[MetricsSettings, Depends(get_settings)]
AggregatorDep = Annotated[Aggregator, Depends(get_aggregator)]
BusDep = Annotated[Bus, Depends(get_bus)]
RendererDep = Annotated[TextRenderer, Depends(get_renderer)]
BuildDep = Annotated[BuildInfo, Depends(get_build)]
HistoryDep = Annotated[History, Depends(get_history)]
