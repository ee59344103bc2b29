"""``POST /filter``, ``/bind``, ``/prioritize``: HAMi's conventions (hami-protocol §4.1), as plain ASGI.

kube-scheduler calls these for every pod, so they skip FastAPI's middleware, routing and dependency
solving (which runs plain-function dependencies in a thread pool): :class:`ExtenderApp` hands their paths
to :func:`serve_verb`, which checks the method and the bearer token, reads the body and answers. The
probes stay ordinary FastAPI routes.

Errors are answered in the protocol's form, here and only here: HTTP 200 with ``Error`` set (kube-scheduler
reads it and retries), 400 ``Please send a request body`` for an empty body, as HAMi does.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from fastapi import FastAPI

from hami_common.errors import HamiError, InvalidInput, TransientError
from hami_common.scheduling import NodePolicy, preference
from hami_extender import paths
from hami_extender.deps import State
from hami_extender.leadership import Leadership
from hami_extender.wire import (
    MAX_BODY,
    BindingResult,
    FilterArgsDecoder,
    FilterResult,
    HostPriority,
    PreemptionResult,
    decode_binding_args,
    decode_preemption_args,
    encode,
)

__all__ = ["ExtenderApp"]

log = logging.getLogger(__name__)

JSON: Final = b"application/json"
TEXT: Final = b"text/plain; charset=utf-8"
EMPTY_BODY: Final = b"Please send a request body"
SERVER_TIMING: Final = b"server-timing"  # how long Filter waited on the apiserver, for latency breakdowns
_MAX_PRIORITY: Final = 10

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Answer:
    body: bytes
    status: int = 200
    content_type: bytes = JSON
    headers: tuple[tuple[bytes, bytes], ...] = ()


Verb = Callable[[State, bytes | None], Awaitable[Answer]]  # the body; None when it was over 1 MiB


class _Detail(msgspec.Struct, frozen=True):
    detail: str


_EMPTY: Final = Answer(EMPTY_BODY, 400, TEXT)
_UNAUTHORISED: Final = Answer(msgspec.json.encode(_Detail("missing or wrong bearer token")), 401)
_NOT_ALLOWED: Final = Answer(msgspec.json.encode(_Detail("Method Not Allowed")), 405, headers=((b"allow", b"POST"),))
_FAILED: Final = Answer(b"Internal Server Error", 500, TEXT)


async def _body(receive: Receive) -> bytes | None:
    """The body, or None when it is over 1 MiB: HAMi's LimitReader truncates, so longer input fails."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def _authorised(scope: Scope, token: str) -> bool:
    """With a bearer token set, only requests that carry it pass; the probes stay open."""
    if not token:
        return True
    given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
    return hmac.compare_digest(given, f"Bearer {token}".encode())


async def _answer(send: Send, answer: Answer) -> None:
    headers = [(b"content-type", answer.content_type), (b"content-length", str(len(answer.body)).encode())]
    headers.extend(answer.headers)
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})


async def serve_verb(verb: Verb, scope: Scope, receive: Receive, send: Send) -> None:
    state: State = scope["state"]
    try:
        if scope["method"] != "POST":
            answer = _NOT_ALLOWED
        elif not _authorised(scope, state["settings"].bearer_token):
            answer = _UNAUTHORISED
        else:
            body = await _body(receive)
            answer = _EMPTY if body == b"" else await verb(state, body)
    except Exception:  # the edge of this protocol: a bug answers 500, logged once, and the server goes on
        log.exception("%s %s failed", scope["method"], scope["path"])
        answer = _FAILED
    await _answer(send, answer)


def _whole(body: bytes | None) -> bytes:
    if body is None:
        raise InvalidInput("decode extender args: unexpected EOF (body over 1 MiB)")
    return body


def _must_lead(leadership: Leadership) -> None:
    if not leadership.leading:
        raise TransientError(f"{leadership.identity} is not the leader; retry against the leader")


def _json(value: msgspec.Struct | list[HostPriority]) -> Answer:
    return Answer(encode(value))


def filter_verb(decoder: FilterArgsDecoder) -> Verb:
    async def filter_nodes(state: State, body: bytes | None) -> Answer:
        started = time.perf_counter()
        try:
            args = decoder.decode(_whole(body))
            _must_lead(state["leadership"])
            await state["readiness"].ensure()
            filtered = await state["placer"].filter(args)
        except HamiError as err:
            log.warning("filter failed: %s", err)
            return _json(FilterResult(error=str(err)))
        total = time.perf_counter() - started
        if filtered.result.node_names and args.pod is not None and args.nodes is None:
            state["placer"].filter_times.record(args.pod.metadata.uid, int(total * 1e9))
        timing = f"filter;dur={total * 1000:.3f}, apiserver;dur={filtered.apiserver_s * 1000:.3f}"
        return Answer(encode(filtered.result), headers=((SERVER_TIMING, timing.encode()),))

    return filter_nodes


async def bind_pod(state: State, body: bytes | None) -> Answer:
    try:
        args = decode_binding_args(_whole(body))
        _must_lead(state["leadership"])
        await state["readiness"].ensure()
        await state["binder"].bind(args)
        result = BindingResult()
    except HamiError as err:
        log.warning("bind failed: %s", err)
        result = BindingResult(error=str(err))
    return _json(result)


def prioritize_verb(decoder: FilterArgsDecoder) -> Verb:
    async def prioritize_nodes(state: State, body: bytes | None) -> Answer:
        """0..10 per node from the cached node score under the default node policy (HAMi has no prioritize)."""
        try:
            args = decoder.decode(_whole(body))
        except HamiError as err:
            log.warning("prioritize failed: %s", err)
            return _json([])
        ledger, settings = state["ledger"], state["settings"]
        policy = NodePolicy.SPREAD if settings.node_scheduler_policy == NodePolicy.SPREAD else NodePolicy.BINPACK
        scores = []
        for name in args.node_names or []:
            view = ledger.view(name)
            score = 0
            if view is not None:
                fraction = preference(view.score, policy) / 30.0  # a node score is 10 x three fractions
                score = round(fraction * _MAX_PRIORITY) if policy is NodePolicy.BINPACK else round((1 + fraction) * 10)
            scores.append(HostPriority(host=name, score=max(0, min(_MAX_PRIORITY, score))))
        return _json(scores)

    return prioritize_nodes


async def preempt_pod(state: State, body: bytes | None) -> Answer:
    """The victims per node that let the pod fit (kube-scheduler's preemption, for GPU slices).

    An error answers an empty map: kube-scheduler then preempts nothing, and the pod waits, as it would
    without a preempt verb."""
    try:
        args = decode_preemption_args(_whole(body))
        _must_lead(state["leadership"])
        await state["readiness"].ensure()
        result = await state["preemptor"].preempt(args)
    except HamiError as err:
        log.warning("preempt failed: %s", err)
        result = PreemptionResult(node_name_to_meta_victims={})
    return _json(result)


class ExtenderApp(FastAPI):
    """FastAPI for the probes; the extender verbs are answered before its middleware stack is entered."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.verbs: dict[str, Verb] = {
            paths.FILTER: filter_verb(FilterArgsDecoder()),
            paths.BIND: bind_pod,
            paths.PRIORITIZE: prioritize_verb(FilterArgsDecoder()),
            paths.PREEMPT: preempt_pod,
        }

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            verb = self.verbs.get(scope["path"])
            if verb is not None:
                await serve_verb(verb, scope, receive, send)
                return
        await super().__call__(scope, receive, send)
