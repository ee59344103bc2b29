"""The web page: ``/ui/`` (a static page and its script) and ``/ui/api/...`` (the views as JSON, read-only).

The JSON endpoints carry the cluster's data and sit behind the same guard as ``/metrics``
(:func:`~hami_metrics.deps.require_token`: the bearer token deploy/ generates, and TLS when configured). The
page and its script hold no data and are served without the token, since a browser cannot send an
``Authorization`` header on a navigation; the script asks for the token when the API answers 401 and sends it
on every request. Everything the page loads comes from this service: no CDN, no external Prometheus.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Annotated, Final

import msgspec
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Response, status
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from hami_metrics import webview
from hami_metrics.deps import AggregatorDep, HistoryDep, require_token
from hami_metrics.history import Chart

__all__ = ["API", "PAGE", "STATIC", "CardPage", "OverviewPage", "WorkloadPage", "mount_static", "router"]

PAGE: Final = "/ui/"
API: Final = "/ui/api"
STATIC: Final = "/ui/static"
_PACKAGE: Final = "hami_metrics"
_JSON: Final = "application/json"
_HTML: Final = "text/html; charset=utf-8"
# Node names are DNS subdomains; card ids are UUIDs or <node>-<vendor>-<i>; a pod is its uid, or
# <namespace>_<name> while it waits without one (schedpath.pending_key).
_NAME: Final = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_CARD: Final = r"^[A-Za-z0-9][A-Za-z0-9._~-]*$"
_UID: Final = r"^[a-z0-9][-a-z0-9._]*$"

NodeName = Annotated[str, Path(pattern=_NAME, max_length=253, description="a node's name")]
CardId = Annotated[str, Path(pattern=_CARD, max_length=253, description="a card's uuid as registered")]
PodUid = Annotated[str, Path(pattern=_UID, max_length=317, description="a pod's uid (or namespace_name)")]


class OverviewPage(msgspec.Struct, frozen=True, kw_only=True):
    overview: webview.Overview
    trend: Chart
    cards: list[webview.CardRow]  # for the heat map
    now_s: float


class CardPage(msgspec.Struct, frozen=True, kw_only=True):
    detail: webview.CardDetail
    history: Chart | None  # None: not sampled yet, or beyond the series cap


class WorkloadPage(msgspec.Struct, frozen=True, kw_only=True):
    detail: webview.WorkloadDetail
    history: Chart | None


_ENCODER: Final = msgspec.json.Encoder()
page = APIRouter()
router = APIRouter(prefix=API, dependencies=[Depends(require_token)])


def _json(value: object) -> Response:
    return Response(_ENCODER.encode(value), media_type=_JSON, headers={"Cache-Control": "no-store"})


def _missing(what: str) -> HTTPException:
    return HTTPException(status_code=status.HTTP_404_NOT_FOUND, detail=f"no {what} in the cluster state")


def _index() -> bytes:
    return (files(_PACKAGE) / "static" / "index.html").read_bytes()


@page.get("/ui", include_in_schema=False)
async def ui_redirect() -> RedirectResponse:
    return RedirectResponse(PAGE)


@page.get(PAGE, include_in_schema=False)
async def ui_page() -> Response:
    return Response(_index(), media_type=_HTML, headers={"Cache-Control": "no-cache"})


@router.get("/overview")
async def ui_overview(aggregator: AggregatorDep, history: HistoryDep) -> Response:
    state = aggregator.snapshot()
    now_ns = aggregator.clock.now_ns()
    return _json(
        OverviewPage(
            overview=webview.overview(state), trend=history.cluster(), cards=webview.cards(state), now_s=now_ns / 1e9
        )
    )


@router.get("/nodes")
async def ui_nodes(aggregator: AggregatorDep) -> Response:
    return _json(webview.nodes(aggregator.snapshot(), aggregator.clock.now_ns()))


@router.get("/nodes/{name}")
async def ui_node(name: NodeName, aggregator: AggregatorDep) -> Response:
    detail = webview.node_detail(aggregator.snapshot(), name, aggregator.clock.now_ns())
    if detail is None:
        raise _missing(f"node {name!r}")
    return _json(detail)


@router.get("/cards")
async def ui_cards(aggregator: AggregatorDep) -> Response:
    return _json(webview.cards(aggregator.snapshot()))


@router.get("/cards/{uuid}")
async def ui_card(uuid: CardId, aggregator: AggregatorDep, history: HistoryDep) -> Response:
    detail = webview.card_detail(aggregator.snapshot(), uuid)
    if detail is None:
        raise _missing(f"card {uuid!r}")
    return _json(CardPage(detail=detail, history=history.card(uuid)))


@router.get("/workloads")
async def ui_workloads(aggregator: AggregatorDep) -> Response:
    return _json(webview.workloads(aggregator.snapshot(), aggregator.clock.now_ns()))


@router.get("/workloads/{uid}")
async def ui_workload(uid: PodUid, aggregator: AggregatorDep, history: HistoryDep) -> Response:
    detail = webview.workload_detail(aggregator.snapshot(), uid, aggregator.clock.now_ns())
    if detail is None:
        raise _missing(f"pod with uid {uid!r}")
    return _json(WorkloadPage(detail=detail, history=history.pod(uid)))


@router.get("/quotas")
async def ui_quotas(aggregator: AggregatorDep) -> Response:
    return _json(webview.quotas(aggregator.snapshot()))


def mount_static(app: FastAPI) -> None:
    """The page (open), its script, style and the charting library ``make webui`` builds (package data)."""
    app.include_router(page)
    app.mount(STATIC, StaticFiles(packages=[(_PACKAGE, "static")]), name="ui-static")
