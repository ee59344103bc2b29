"""Write operations whose rules go beyond the store: replace, the three patch types, delete, and binding."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from hami_sim.kubeapi._errors import ApiError, bad_request, conflict_on, not_found
from hami_sim.kubeapi._objects import check_shape
from hami_sim.kubeapi._patch import (
    PatchError,
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
)
from hami_sim.kubeapi._resources import ResourceType, find
from hami_sim.kubeapi._store import Store

__all__ = ["Handlers"]

JsonObj = dict[str, Any]

MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC_PATCH: Final = "application/strategic-merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"

_PODS: Final = find("", "v1", "pods")


def _pods() -> ResourceType:
    assert _PODS is not None
    return _PODS


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Handlers:
    def __init__(self, store: Store) -> None:
        self.store = store

    def replace(self, rt: ResourceType, namespace: str | None, name: str, body: object, sub: str) -> JsonObj:
        desired = check_shape(body)  # without a resourceVersion the update is unconditional, as upstream
        return self.store.update(rt, namespace, name, lambda _current: desired, sub)

    def patch(
        self, rt: ResourceType, namespace: str | None, name: str, content_type: str, body: object, sub: str
    ) -> JsonObj:
        if content_type == MERGE_PATCH:
            if not isinstance(body, dict):
                raise bad_request("a merge patch must be a JSON object")
            check_shape(body, "patch", patch=True)
            apply: Callable[[Any, Any], Any] = apply_merge_patch
        elif content_type == STRATEGIC_PATCH:
            check_shape(body, "patch", patch=True)
            apply = apply_strategic_merge_patch
        elif content_type == JSON_PATCH:
            apply = apply_json_patch
        elif content_type == APPLY_PATCH:
            raise ApiError(415, "UnsupportedMediaType", "server-side apply is not supported by the emulator")
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - "
                f"accepted media types include: {JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_PATCH}",
            )

        def mutate(current: JsonObj) -> JsonObj:
            try:
                patched = apply(current, body)
            except PatchError as err:
                if err.bad_request:
                    raise bad_request(str(err)) from None
                raise ApiError(422, "Invalid", f"the patch could not be applied: {err}") from None
            patched = check_shape(patched, "patched object")
            # A patch without a resourceVersion is unconditional: it is compared with the current one.
            meta = patched.setdefault("metadata", {})
            if meta.get("resourceVersion") in (None, ""):
                meta["resourceVersion"] = current["metadata"]["resourceVersion"]
            return patched

        return self.store.update(rt, namespace, name, mutate, sub)

    def delete(self, rt: ResourceType, namespace: str | None, name: str, options: object) -> JsonObj:
        if not isinstance(options, dict):
            raise bad_request("DeleteOptions must be a JSON object")
        pre = options.get("preconditions") or {}
        if not isinstance(pre, dict):
            raise bad_request("preconditions must be an object")
        uid, rv = pre.get("uid"), pre.get("resourceVersion")
        if not isinstance(uid, str | None) or not isinstance(rv, str | None):
            raise bad_request("preconditions must hold strings")
        grace = options.get("gracePeriodSeconds")
        if not isinstance(grace, int | None) or isinstance(grace, bool):
            raise bad_request("gracePeriodSeconds must be an integer")
        return self.store.delete(rt, namespace, name, uid=uid, rv=rv, grace=grace)

    def bind(self, namespace: str | None, name: str | None, body: object) -> JsonObj:
        """``pods/binding``: set ``spec.nodeName`` once; 409 if the pod is bound already."""
        binding = check_shape(body, "Binding")
        metadata = binding.get("metadata") or {}
        if binding.get("kind") not in (None, "Binding"):
            raise bad_request(f"expected a Binding, got {binding.get('kind')!r}")
        if name is None:
            name = metadata.get("name") or ""
        elif metadata.get("name") != name:
            raise bad_request("name in URL does not match name in Binding object")
        target = binding.get("target")
        if not isinstance(target, dict) or target.get("kind", "") not in ("", "Node") or not target.get("name"):
            raise ApiError(
                500,
                "InternalError",
                "Internal error occurred: [target.kind: Invalid value: "
                "must be empty or 'Node', target.name: Required value]",
            )
        node = target["name"]
        if not isinstance(node, str):
            raise bad_request("target.name must be a string")
        pods = _pods()

        def conflict(why: str) -> ApiError:
            return conflict_on("pods/binding", "", str(name), why)

        def assign(pod: JsonObj) -> JsonObj:
            meta, spec = pod["metadata"], pod.setdefault("spec", {})
            if metadata.get("uid") and metadata["uid"] != meta["uid"]:
                raise conflict("Precondition failed: UID in precondition does not match")
            if metadata.get("resourceVersion") and metadata["resourceVersion"] != meta["resourceVersion"]:
                raise conflict("the object has been modified")
            if meta.get("deletionTimestamp"):
                raise conflict(f"pod {name} is being deleted, cannot be assigned to a host")
            if spec.get("nodeName"):
                raise conflict(f'pod {name} is already assigned to node "{spec["nodeName"]}"')
            if spec.get("schedulingGates"):
                raise conflict(f"pod {name} has non-empty .spec.schedulingGates")
            spec["nodeName"] = node
            annotations = metadata.get("annotations") or {}
            if annotations:
                meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
            status = pod.setdefault("status", {})
            conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": _now(),
                }
            )
            status["conditions"] = conditions
            return pod

        try:
            self.store.bind(pods, namespace, name, assign)
        except ApiError as err:
            if err.code == 404:
                raise not_found(pods, name) from None
            raise
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
