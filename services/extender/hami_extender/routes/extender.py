"""``POST /filter``, ``/bind``, ``/prioritize``: HAMi's conventions (hami-protocol §4.1).

Errors are answered in the protocol's form, here and only here: HTTP 200 with ``Error`` set (kube-scheduler
reads it and retries), 400 ``Please send a request body`` for an empty body, as HAMi does.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from fastapi import APIRouter, Depends, Request, Response

from hami_common.errors import HamiError, InvalidInput, TransientError
from hami_common.scheduling import NodePolicy, preference
from hami_extender import paths
from hami_extender.deps import BinderDep, LeadershipDep, LedgerDep, PlacerDep, ReadinessDep, SettingsDep, require_token
from hami_extender.wire import (
    MAX_BODY,
    BindingResult,
    FilterResult,
    HostPriority,
    decode_binding_args,
    decode_filter_args,
    encode,
)

__all__ = ["router"]

log = logging.getLogger(__name__)

JSON: Final = "application/json"
EMPTY_BODY: Final = "Please send a request body"
SERVER_TIMING: Final = "Server-Timing"  # how long Filter waited on the apiserver, for latency breakdowns
_MAX_PRIORITY: Final = 10

router = APIRouter(dependencies=[Depends(require_token)])


class _EmptyBody(Exception):
    """The request had no body at all."""


async def _body(request: Request) -> bytes:
    """At most 1 MiB + 1 byte: HAMi's LimitReader truncates, so longer input fails to decode."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY:
            break
    body = b"".join(chunks)
    if not body:
        raise _EmptyBody
    if len(body) > MAX_BODY:
        raise InvalidInput("decode extender args: unexpected EOF (body over 1 MiB)")
    return body


def _json(payload: bytes) -> Response:
    return Response(payload, media_type=JSON)


def _empty() -> Response:
    return Response(EMPTY_BODY, status_code=400, media_type="text/plain")


def _must_lead(leadership: LeadershipDep) -> None:
    if not leadership.leading:
        raise TransientError(f"{leadership.identity} is not the leader; retry against the leader")


@router.post(paths.FILTER)
async def filter_nodes(request: Request, placer: PlacerDep, leadership: LeadershipDep, ready: ReadinessDep) -> Response:
    started = time.perf_counter()
    try:
        args = decode_filter_args(await _body(request))
        _must_lead(leadership)
        await ready.ensure()
        filtered = await placer.filter(args)
    except _EmptyBody:
        return _empty()
    except HamiError as err:
        log.warning("filter failed: %s", err)
        return _json(encode(FilterResult(error=str(err))))
    response = _json(encode(filtered.result))
    total = time.perf_counter() - started
    response.headers[SERVER_TIMING] = f"filter;dur={total * 1000:.3f}, apiserver;dur={filtered.apiserver_s * 1000:.3f}"
    return response


@router.post(paths.BIND)
async def bind_pod(request: Request, binder: BinderDep, leadership: LeadershipDep, ready: ReadinessDep) -> Response:
    try:
        args = decode_binding_args(await _body(request))
        _must_lead(leadership)
        await ready.ensure()
        await binder.bind(args)
        result = BindingResult()
    except _EmptyBody:
        return _empty()
    except HamiError as err:
        log.warning("bind failed: %s", err)
        result = BindingResult(error=str(err))
    return _json(encode(result))


@router.post(paths.PRIORITIZE)
async def prioritize_nodes(request: Request, ledger: LedgerDep, settings: SettingsDep) -> Response:
    """0..10 per node from the cached node score under the default node policy (HAMi has no prioritize)."""
    try:
        args = decode_filter_args(await _body(request))
    except _EmptyBody:
        return _empty()
    except HamiError as err:
        log.warning("prioritize failed: %s", err)
        return _json(encode([]))
    policy = NodePolicy.SPREAD if settings.node_scheduler_policy == NodePolicy.SPREAD else NodePolicy.BINPACK
    scores = []
    for name in args.node_names or []:
        view = ledger.view(name)
        score = 0
        if view is not None:
            fraction = preference(view.score, policy) / 30.0  # a node score is 10 x three fractions
            score = round(fraction * _MAX_PRIORITY) if policy is NodePolicy.BINPACK else round((1 + fraction) * 10)
        scores.append(HostPriority(host=name, score=max(0, min(_MAX_PRIORITY, score))))
    return _json(encode(scores))
