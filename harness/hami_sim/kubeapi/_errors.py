"""API errors and the ``Status`` objects the apiserver answers them with."""

from __future__ import annotations

from typing import Any, Final

from hami_sim.kubeapi._resources import ResourceType

__all__ = [
    "ApiError",
    "already_exists",
    "bad_request",
    "conflict",
    "conflict_on",
    "gone",
    "invalid",
    "not_found",
    "status_body",
]

JsonObj = dict[str, Any]


class ApiError(Exception):
    """One failed request; ``status()`` is the body the API answers with."""

    def __init__(self, code: int, reason: str, message: str, details: JsonObj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> JsonObj:
        return status_body(self.code, self.reason, self.message, self.details)


def status_body(code: int, reason: str, message: str, details: JsonObj | None = None) -> JsonObj:
    body: JsonObj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
    }
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def _details(rt: ResourceType, name: str) -> JsonObj:
    details: JsonObj = {"name": name, "kind": rt.plural}
    if rt.group:
        details["group"] = rt.group
    return details


def _resource(rt: ResourceType) -> str:
    return f"{rt.plural}.{rt.group}" if rt.group else rt.plural


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{_resource(rt)} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{_resource(rt)} "{name}" already exists', _details(rt, name))


def conflict(rt: ResourceType, name: str, why: str) -> ApiError:
    return conflict_on(rt.plural, rt.group, name, why)


def conflict_on(resource: str, group: str, name: str, why: str) -> ApiError:
    """409 Conflict on ``resource`` as kube-apiserver names it: a plural, a subresource (``pods/binding``),
    or a kind (a failed delete precondition is reported on ``Pod``)."""
    details: JsonObj = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    label = f"{resource}.{group}" if group else resource
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {label} "{name}": {why}', details)


STALE = "the object has been modified; please apply your changes to the latest version and try again"


_CAUSES: Final = (
    ("Required value", "FieldValueRequired"),
    ("Forbidden", "FieldValueForbidden"),
    ("Duplicate value", "FieldValueDuplicate"),
    ("Unsupported value", "FieldValueNotSupported"),
)


def _cause_reason(message: str) -> str:
    return next((reason for prefix, reason in _CAUSES if message.startswith(prefix)), "FieldValueInvalid")


def invalid(rt: ResourceType, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 Invalid; ``causes`` are (field, message) with kube-apiserver's message prefixes (``Required
    value``, ``Invalid value: ...``), which also give each cause its reason."""
    parts = [f"{field}: {msg}" for field, msg in causes]
    text = parts[0] if len(parts) == 1 else f"[{', '.join(parts)}]"
    details = _details(rt, name) | {"kind": rt.kind}
    details["causes"] = [{"reason": _cause_reason(m), "message": m, "field": f} for f, m in causes]
    return ApiError(422, "Invalid", f'{rt.kind} "{name}" is invalid: {text}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)
