"""Pure rules for stored objects: shape checks, validation, defaults, and what an update may change."""

from __future__ import annotations

import copy
import re
import secrets
from typing import Any, Final

from hami_sim.kubeapi._errors import ApiError, bad_request, invalid
from hami_sim.kubeapi._resources import ResourceType

__all__ = [
    "check_shape",
    "generate_name",
    "normalize_quantities",
    "pod_spec_change",
    "prepare_create",
    "validate",
]

JsonObj = dict[str, Any]

_DNS_SUBDOMAIN: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE: Final = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUALIFIED_NAME: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_NAME_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
# Pod spec fields an update may change (upstream: "pod updates may not change fields other than ...").
_POD_MUTABLE: Final = (
    "activeDeadlineSeconds",
    "tolerations",
    "schedulingGates",
    "terminationGracePeriodSeconds",
)


def check_shape(obj: object, what: str = "object", *, patch: bool = False) -> JsonObj:
    """The decoding errors a Go apiserver reports as 400: wrong JSON types in the fields we read.
    In a ``patch``, ``null`` values are allowed (they delete)."""
    if not isinstance(obj, dict):
        raise bad_request(f"{what} must be a JSON object")
    metadata = obj.get("metadata", {})
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise bad_request("metadata must be an object")
    for field in ("name", "namespace", "generateName", "resourceVersion", "uid"):
        if field in metadata and not isinstance(metadata[field], str | None):
            raise bad_request(f"metadata.{field} must be a string")
    for field in ("labels", "annotations"):
        value = metadata.get(field)
        if value is None:
            continue
        allowed = (str, type(None)) if patch else (str,)
        if not isinstance(value, dict) or not all(isinstance(v, allowed) for v in value.values()):
            raise bad_request(f"metadata.{field} must be a map of strings")
    for field in ("spec", "status"):
        if obj.get(field) is not None and not isinstance(obj[field], dict):
            raise bad_request(f"{field} must be an object")
    return obj


def _quantity(value: object, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{where}: quantities must be strings or numbers")
    if isinstance(value, int) or value.is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def _normalize_map(holder: object, field: str, where: str) -> None:
    if not isinstance(holder, dict) or holder.get(field) is None:
        return
    values = holder[field]
    if not isinstance(values, dict):
        raise bad_request(f"{where}.{field} must be a map of quantities")
    holder[field] = {k: _quantity(v, f"{where}.{field}[{k}]") for k, v in values.items()}


def normalize_quantities(rt: ResourceType, obj: JsonObj) -> None:
    """Store quantities as strings, as an apiserver does (YAML ``nvidia.com/gpu: 1`` arrives as a number)."""
    spec, status = obj.get("spec"), obj.get("status")
    if rt.plural == "pods" and isinstance(spec, dict):
        for group in ("containers", "initContainers"):
            for i, container in enumerate(spec.get(group) or []):
                resources = container.get("resources") if isinstance(container, dict) else None
                for field in ("limits", "requests"):
                    _normalize_map(resources, field, f"spec.{group}[{i}].resources")
    elif rt.plural == "nodes":
        for field in ("capacity", "allocatable"):
            _normalize_map(status, field, "status")
    elif rt.plural == "resourcequotas":
        _normalize_map(spec, "hard", "spec")
        for field in ("hard", "used"):
            _normalize_map(status, field, "status")


def generate_name(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))


def _validate_metadata(rt: ResourceType, name: str, metadata: JsonObj) -> list[tuple[str, str]]:
    causes: list[tuple[str, str]] = []
    pattern = _DNS_LABEL if rt.plural == "namespaces" else _DNS_SUBDOMAIN
    if not name:
        causes.append(("metadata.name", "Required value: name or generateName is required"))
    elif len(name) > 253 or not pattern.match(name):
        causes.append(("metadata.name", f'Invalid value: "{name}": a lowercase RFC 1123 name is required'))
    for key, value in (metadata.get("labels") or {}).items():
        if not _qualified_key(key):
            causes.append(("metadata.labels", f'Invalid value: "{key}": not a qualified name'))
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            causes.append(("metadata.labels", f'Invalid value: "{value}": not a valid label value'))
    for key in metadata.get("annotations") or {}:
        if not _qualified_key(key):
            causes.append(("metadata.annotations", f'Invalid value: "{key}": not a qualified name'))
    return causes


def _qualified_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_QUALIFIED_NAME.match(name))


def _validate_pod(obj: JsonObj) -> list[tuple[str, str]]:
    spec = obj.get("spec") or {}
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return [("spec.containers", "Required value")]
    causes = []
    for i, container in enumerate(containers):
        if not isinstance(container, dict) or not container.get("name"):
            causes.append((f"spec.containers[{i}].name", "Required value"))
        elif not container.get("image"):
            causes.append((f"spec.containers[{i}].image", "Required value"))
    return causes


def validate(rt: ResourceType, obj: JsonObj) -> None:
    metadata = obj.get("metadata") or {}
    name = metadata.get("name") or ""
    causes = _validate_metadata(rt, name, metadata)
    if rt.plural == "pods":
        causes += _validate_pod(obj)
    if causes:
        raise invalid(rt, name, causes)


def prepare_create(rt: ResourceType, obj: JsonObj, namespace: str | None, now: str, uid: str) -> JsonObj:
    """The object as stored on create: identity, timestamps and defaults filled in, system fields reset."""
    obj = check_shape(obj)
    kind, api_version = obj.get("kind"), obj.get("apiVersion")
    if (kind and kind != rt.kind) or (api_version and api_version != rt.api_version):
        raise bad_request(f"the object kind {api_version}/{kind} does not match {rt.api_version}/{rt.kind}")
    result = copy.deepcopy(obj)
    metadata = dict(result.get("metadata") or {})
    body_ns = metadata.get("namespace")
    if namespace is not None and body_ns and body_ns != namespace:
        raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
    if not metadata.get("name") and metadata.get("generateName"):
        metadata["name"] = generate_name(metadata["generateName"])
    for field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
        metadata.pop(field, None)
    if namespace is not None:
        metadata["namespace"] = namespace
    else:
        metadata.pop("namespace", None)
    metadata["uid"] = uid
    metadata["creationTimestamp"] = now
    result["metadata"] = metadata
    result["kind"] = rt.kind
    result["apiVersion"] = rt.api_version
    normalize_quantities(rt, result)
    validate(rt, result)
    _default(rt, result)
    return result


def _default(rt: ResourceType, obj: JsonObj) -> None:
    if rt.plural == "pods":
        spec = obj.setdefault("spec", {})
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        status = obj.setdefault("status", {})
        status.setdefault("phase", "Pending")
    elif rt.plural == "namespaces":
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")
    elif rt.plural in ("nodes", "resourcequotas"):
        obj.setdefault("spec", {})
        obj.setdefault("status", {})


def _comparable_pod_spec(spec: JsonObj) -> JsonObj:
    result = {k: v for k, v in spec.items() if k not in _POD_MUTABLE}
    for field in ("containers", "initContainers"):
        items = result.get(field)
        if isinstance(items, list):
            result[field] = [{k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c for c in items]
    return result


def pod_spec_change(rt: ResourceType, name: str, old: JsonObj, new: JsonObj) -> None:
    """Raise 422 when an update changes a pod spec field upstream treats as immutable (``nodeName``...)."""
    old_spec = old.get("spec") or {}
    new_spec = new.get("spec") or {}
    if _comparable_pod_spec(old_spec) != _comparable_pod_spec(new_spec):
        raise ApiError(
            422,
            "Invalid",
            f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields other than '
            "`spec.containers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions "
            "to existing tolerations), `spec.terminationGracePeriodSeconds`",
            {"name": name, "kind": "Pod", "causes": [{"reason": "FieldValueForbidden", "field": "spec"}]},
        )
