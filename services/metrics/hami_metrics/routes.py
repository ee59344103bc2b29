"""HTTP endpoints: ``/metrics`` (optionally behind a bearer token) and ``/healthz`` (always open)."""

from __future__ import annotations

import asyncio
import gzip
from typing import Final

from fastapi import APIRouter, Depends, Request, Response

from hami_metrics.deps import AggregatorDep, BuildDep, BusDep, RendererDep, SettingsDep, require_token
from hami_metrics.exposition import Scrape, collect
from hami_metrics.state import ClusterState
from hami_metrics.textformat import CONTENT_TYPE, TextRenderer

__all__ = ["HEALTHZ", "METRICS", "router"]

METRICS: Final = "/metrics"
HEALTHZ: Final = "/healthz"
GZIP: Final = "gzip"
_GZIP_LEVEL: Final = 1  # a scrape body is tens of MB at a thousand nodes: speed over ratio

router = APIRouter()


def _render(renderer: TextRenderer, state: ClusterState, scrape: Scrape, compress: bool) -> bytes:
    body = renderer.render(collect(state, scrape))
    return gzip.compress(body, compresslevel=_GZIP_LEVEL, mtime=0) if compress else body


@router.get(METRICS, dependencies=[Depends(require_token)])
async def scrape_metrics(
    request: Request,
    settings: SettingsDep,
    aggregator: AggregatorDep,
    bus: BusDep,
    renderer: RendererDep,
    build: BuildDep,
) -> Response:
    state = aggregator.snapshot()
    scrape = Scrape(
        now_ns=aggregator.clock.now_ns(),
        build=build,
        legacy=settings.legacy_metrics,
        bus_counts=dict(bus.stats.counts),
        bus_connected=bus.connected,
        shard_index=settings.shard_index,
        shard_count=settings.shard_count,
    )
    compress = GZIP in request.headers.get("accept-encoding", "").lower()
    # The state is immutable, so a worker thread renders it while the loop keeps folding newer events.
    body = await asyncio.to_thread(_render, renderer, state, scrape, compress)
    headers = {"Content-Encoding": GZIP, "Vary": "Accept-Encoding"} if compress else None
    return Response(body, media_type=CONTENT_TYPE, headers=headers)


@router.get(HEALTHZ)
async def health(bus: BusDep, aggregator: AggregatorDep) -> dict[str, object]:
    """Liveness: answers while the process serves; reports NATS as it stands rather than failing on it."""
    return {
        "status": "ok",
        "nats": "connected" if bus.connected else "disconnected",
        "nodes": len(aggregator.state.nodes),
        "applied": aggregator.state.applied,
    }
