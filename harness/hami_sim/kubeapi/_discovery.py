"""Discovery: the documents kubectl and the client read before they touch a resource."""

from __future__ import annotations

from typing import Any, Final

from starlette.responses import PlainTextResponse, Response

from hami_sim.kubeapi._errors import ApiError
from hami_sim.kubeapi._resources import (
    RESOURCES,
    ResourceType,
    api_group,
    api_group_list,
    api_resource_list,
    api_versions,
)

__all__ = ["VERSION", "document"]

JsonObj = dict[str, Any]

VERSION: Final = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-hami-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_HEALTH: Final = frozenset({"healthz", "livez", "readyz"})


def _missing(path: str) -> ApiError:
    return ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")


def document(parts: list[str], server_address: str) -> JsonObj | Response | None:
    """The discovery answer for ``parts``, or None when the path names a resource instead."""
    if not parts:
        groups = sorted({f"/apis/{rt.group}/{rt.version}" for rt in RESOURCES if rt.group})
        return {"paths": ["/api", "/api/v1", "/apis", *groups, "/healthz", "/version"]}
    head = parts[0]
    if len(parts) == 1 and head in _HEALTH:
        return PlainTextResponse("ok")
    if parts == ["version"]:
        return dict(VERSION)
    if head == "openapi":
        doc = _openapi(parts[1:])
        if doc is None:
            raise _missing("/" + "/".join(parts))
        return doc
    if parts == ["api"]:
        return api_versions(server_address)
    if parts == ["api", "v1"]:
        return api_resource_list("", "v1")
    if parts == ["apis"]:
        return api_group_list()
    if head == "apis" and len(parts) in (2, 3):
        doc = api_group(parts[1]) if len(parts) == 2 else api_resource_list(parts[1], parts[2])
        if doc is None:
            raise _missing("/" + "/".join(parts))
        return doc
    return None


def _gv_path(rt: ResourceType) -> str:
    return f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}"


def _openapi(parts: list[str]) -> JsonObj | None:
    """A minimal OpenAPI v3: enough for kubectl to see that PATCH takes ``fieldValidation``, so it leaves
    validation to the server instead of downloading full schemas. There is no OpenAPI v2."""
    if parts == ["v3"]:
        paths = {_gv_path(rt): {"serverRelativeURL": f"/openapi/v3/{_gv_path(rt)}?hash=0"} for rt in RESOURCES}
        return {"paths": paths}
    if not parts or parts[0] != "v3":
        return None
    gv = "/".join(parts[1:])
    types = [rt for rt in RESOURCES if _gv_path(rt) == gv]
    if not types:
        return None
    operations: JsonObj = {}
    for rt in types:
        scope = f"/{gv}/namespaces/{{namespace}}" if rt.namespaced else f"/{gv}"
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        param = {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}
        operations[f"{scope}/{rt.plural}/{{name}}"] = {
            "patch": {
                "operationId": f"patch{rt.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": [param],
                "responses": {"200": {"description": "OK"}},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": VERSION["gitVersion"]},
        "paths": operations,
        "components": {"schemas": {}},
    }
