"""The one place where the kubernetes client's failures become this project's errors."""

from __future__ import annotations

from typing import Final

import msgspec
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from hami_common.errors import Conflict, Forbidden, HamiError, InvalidInput, NotFound, TransientError
from hami_common.kube._types import Status

__all__ = ["from_client_error", "from_status"]

_DEFAULT_RETRY_AFTER: Final = 1.0


def _message(body: object, fallback: str) -> str:
    if isinstance(body, bytes | str) and body:
        try:
            status = msgspec.json.decode(body, type=Status)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return fallback
        return status.message or fallback
    return fallback


def from_status(code: int, message: str, retry_after: float = _DEFAULT_RETRY_AFTER) -> HamiError:
    """404 → NotFound, 409 → Conflict, 401/403 → Forbidden, 429/5xx → TransientError, other 4xx → InvalidInput."""
    if code == 404:
        return NotFound(message)
    if code in (401, 403):
        return Forbidden(message)
    if code == 409:
        return Conflict(message)
    if code == 429 or code >= 500 or code == 0:
        return TransientError(message, retry_after=retry_after)
    return InvalidInput(message)


def _retry_after(exc: ApiException) -> float:
    headers = getattr(exc, "headers", None) or {}
    try:
        return float(headers.get("Retry-After", _DEFAULT_RETRY_AFTER))
    except (TypeError, ValueError):
        return _DEFAULT_RETRY_AFTER


def from_client_error(exc: BaseException, what: str) -> HamiError:
    """Translate one failure of a client call about ``what`` (e.g. ``pod default/p``)."""
    if isinstance(exc, ApiException):
        code = int(exc.status or 0)
        detail = _message(exc.body, str(exc.reason or "request failed"))
        return from_status(code, f"{what}: {detail}", _retry_after(exc))
    if isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError):
        return TransientError(f"{what}: apiserver unreachable: {exc}")
    if isinstance(exc, msgspec.DecodeError | msgspec.ValidationError):
        return InvalidInput(f"{what}: undecodable answer from the apiserver: {exc}")
    raise TypeError(f"not a client error: {exc!r}") from exc
