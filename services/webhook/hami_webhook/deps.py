"""Dependencies of the routes: what the lifespan opened, reached through the request's state.

They are ``async`` on purpose: FastAPI runs plain functions in a worker thread, a hop per request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, TypedDict

from fastapi import Depends, Request

from hami_webhook.reviewer import Reviewer
from hami_webhook.settings import WebhookSettings

__all__ = ["ReadyDep", "ReviewerDep", "SettingsDep", "State", "get_ready", "get_reviewer", "get_settings"]


class State(TypedDict):
    """What the lifespan hands to every request."""

    settings: WebhookSettings
    reviewer: Reviewer
    ready: Callable[[], bool]


async def get_settings(request: Request) -> WebhookSettings:
    settings: WebhookSettings = request.state.settings
    return settings


async def get_reviewer(request: Request) -> Reviewer:
    reviewer: Reviewer = request.state.reviewer
    return reviewer


async def get_ready(request: Request) -> Callable[[], bool]:
    ready: Callable[[], bool] = request.state.ready
    return ready


SettingsDep = Annotated[WebhookSettings, Depends(get_settings)]
ReviewerDep = Annotated[Reviewer, Depends(get_reviewer)]
ReadyDep = Annotated[Callable[[], bool], Depends(get_ready)]
