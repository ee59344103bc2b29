"""The aggregator's FastAPI app: the lifespan connects the bus, subscribes, and hands state to requests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata
from typing import TypedDict

from fastapi import FastAPI

from hami_common.bus import Bus
from hami_common.settings import load
from hami_metrics import routes, webroutes
from hami_metrics.aggregator import Aggregator, Shard
from hami_metrics.exposition import BuildInfo
from hami_metrics.history import History
from hami_metrics.settings import MetricsSettings
from hami_metrics.state import NS_PER_S
from hami_metrics.textformat import TextRenderer

__all__ = ["State", "create_app"]

_DISTRIBUTION = "hami-py"


class State(TypedDict):
    settings: MetricsSettings
    aggregator: Aggregator
    bus: Bus
    renderer: TextRenderer
    build: BuildInfo
    token: str
    history: History


def _version() -> str:
    try:
        return metadata.version(_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


async def _sample(aggregator: Aggregator, history: History) -> None:
    """Feed the web page's history: one sample of the (expired) state per interval, until cancelled."""
    interval_s = history.limits.interval_ns / NS_PER_S
    while True:
        history.record(aggregator.snapshot(), aggregator.clock.now_ns())
        await asyncio.sleep(interval_s)


def create_app(
    settings: MetricsSettings | None = None, *, aggregator: Aggregator | None = None, bus: Bus | None = None
) -> FastAPI:
    """The app. ``aggregator`` gives a caller a handle on the state it folds into (and its clock); ``bus``
    makes it subscribe on a connection the caller owns, so the caller's publishes are ordered after them.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[State]:
        s = settings or load(MetricsSettings, [])  # the environment is read here, once, unless given settings
        token = s.token()
        agg = aggregator or Aggregator(s.retention(), shard=Shard(s.shard_index, s.shard_count))
        async with contextlib.AsyncExitStack() as stack:
            connected: Bus = bus if bus is not None else await stack.enter_async_context(await Bus.connect(s))
            for subscription in await agg.subscribe(connected):
                stack.push_async_callback(subscription.stop)
            stack.push_async_callback(agg.close)
            history = History(s.history_limits())
            sampler = asyncio.create_task(_sample(agg, history), name="history")
            stack.callback(sampler.cancel)
            yield {
                "settings": s,
                "aggregator": agg,
                "bus": connected,
                "renderer": TextRenderer(),
                "build": BuildInfo(version=_version()),
                "token": token,
                "history": history,
            }

    app = FastAPI(title="hami-metrics", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(routes.router)
    app.include_router(webroutes.router)
    webroutes.mount_static(app)
    return app
