"""``POST /webhook``: one AdmissionReview in, one out (k8s-interfaces §3.1).

The query string the apiserver appends (``?timeout=10s``) is ignored. A body that is not JSON, too
large, or not an AdmissionReview gets HTTP 400 (docs/hami-differences.md says why); a wrong Content-Type
and everything else get HTTP 200 and an AdmissionReview, as controller-runtime answers.
"""

from __future__ import annotations

import logging
from typing import Final

from fastapi import APIRouter, Request, Response
from starlette.requests import ClientDisconnect

from hami_webhook.deps import ReviewerDep
from hami_webhook.reviewer import HTTP_BAD_REQUEST, HTTP_INTERNAL, INTERNAL_ERROR, error_review
from hami_webhook.routes import paths

__all__ = ["router"]

log = logging.getLogger(__name__)

JSON: Final = "application/json"
HTTP_OK: Final = 200

router = APIRouter()


class _TooLarge(Exception):
    """The body is over the limit."""


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _bad_request(message: str) -> Response:
    log.warning("rejected an admission request: %s", message)
    return Response(error_review(HTTP_BAD_REQUEST, message), status_code=HTTP_BAD_REQUEST, media_type=JSON)


@router.post(paths.WEBHOOK)
async def review_admission(request: Request, reviewer: ReviewerDep) -> Response:
    content_type = request.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() != JSON:
        # controller-runtime answers this one in protocol form: HTTP 200, Errored(400) in the body.
        message = f"contentType={content_type}, expected {JSON}"
        log.warning("rejected an admission request: %s", message)
        return Response(error_review(HTTP_BAD_REQUEST, message), status_code=HTTP_OK, media_type=JSON)
    try:
        body = await _read_body(request, reviewer.max_body_bytes)
    except _TooLarge:
        return _bad_request(f"request body is larger than {reviewer.max_body_bytes} bytes")
    except ClientDisconnect:  # dropped mid-body (read deadline, or evicted at the connection cap): nobody to answer
        log.debug("an admission request was dropped before its body arrived")
        return Response(status_code=HTTP_BAD_REQUEST)
    try:
        status, payload = await reviewer.review_and_write(body, request.headers)
    except Exception:  # the one broad catch of this edge: a bug answers in protocol form, never a 500 page
        log.exception("admission review failed")
        reviewer.stats["failed"] += 1
        status, payload = HTTP_OK, error_review(HTTP_INTERNAL, INTERNAL_ERROR)
    return Response(payload, status_code=status, media_type=JSON)
