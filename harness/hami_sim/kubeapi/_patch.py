"""The three patch formats of the Kubernetes API, applied to plain JSON documents.

* JSON merge patch (RFC 7386): maps merge recursively, ``null`` deletes, everything else replaces.
* JSON patch (RFC 6902): a list of ``add``/``remove``/``replace``/``move``/``copy``/``test`` operations.
* Strategic merge patch: a merge patch that merges the lists Kubernetes declares with a merge key
  (containers by ``name``, conditions by ``type``, ...) and understands the ``$patch``,
  ``$setElementOrder``, ``$retainKeys`` and ``$deleteFromPrimitiveList`` directives kubectl sends.

Every function is pure: it returns a new document and raises :class:`PatchError` on a patch it cannot apply.
"""

from __future__ import annotations

import copy
from typing import Any, Final

__all__ = ["PatchError", "apply_json_patch", "apply_merge_patch", "apply_strategic_merge_patch"]

Json = Any

# Lists merged element-wise by strategic merge patch, keyed by field name -> merge key.
MERGE_KEYS: Final = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "volumes": "name",
    "conditions": "type",
    "addresses": "type",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "taints": "key",
    "hostAliases": "ip",
    "schedulingGates": "name",
    "resourceClaims": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
}
# Lists of scalars merged as sets.
SET_LISTS: Final = frozenset({"finalizers"})

_DIRECTIVE: Final = "$patch"
_ORDER_PREFIX: Final = "$setElementOrder/"
_DELETE_PRIMITIVE_PREFIX: Final = "$deleteFromPrimitiveList/"
_RETAIN_KEYS: Final = "$retainKeys"


class PatchError(ValueError):
    """The patch is malformed (``bad_request``) or cannot be applied to this document."""

    def __init__(self, message: str, *, bad_request: bool = False) -> None:
        super().__init__(message)
        self.bad_request = bad_request


def apply_merge_patch(target: Json, patch: Json) -> Json:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


# --- JSON patch -------------------------------------------------------------------------------------------


def _pointer(path: object) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(f"invalid JSON pointer {path!r}", bad_request=True)
    if path == "":
        return []
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _index(container: list[Any], token: str, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r}")
    index = int(token)
    limit = len(container) if allow_end else len(container) - 1
    if index > limit:
        raise PatchError(f"array index {index} out of range")
    return index


def _parent(doc: Json, parts: list[str]) -> Json:
    node = doc
    for token in parts[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"path segment {token!r} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, allow_end=False)]
        else:
            raise PatchError(f"cannot descend into a scalar at {token!r}")
    return node


def _get(doc: Json, parts: list[str]) -> Json:
    if not parts:
        return doc
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path {'/'.join(parts)!r} does not exist")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, allow_end=False)]
    raise PatchError("cannot index a scalar")


def _remove(doc: Json, parts: list[str]) -> Json:
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path {'/'.join(parts)!r} does not exist")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, allow_end=False))
    raise PatchError("cannot remove from a scalar")


def _add(doc: Json, parts: list[str], value: Json, *, replace: bool) -> Json:
    if not parts:
        return value
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"path {'/'.join(parts)!r} does not exist")
        parent[last] = value
    elif isinstance(parent, list):
        if replace:
            parent[_index(parent, last, allow_end=False)] = value
        else:
            parent.insert(_index(parent, last, allow_end=True), value)
    else:
        raise PatchError("cannot add to a scalar")
    return doc


def apply_json_patch(target: Json, operations: Json) -> Json:
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations", bad_request=True)
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            raise PatchError(f"invalid JSON patch operation {op!r}", bad_request=True)
        kind = op["op"]
        parts = _pointer(op.get("path"))
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"operation {kind} needs a value", bad_request=True)
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op["value"]), replace=False)
        elif kind == "replace":
            doc = _add(doc, parts, copy.deepcopy(op["value"]), replace=True)
        elif kind == "remove":
            _remove(doc, parts)
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from"))
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
            doc = _add(doc, parts, value, replace=False)
        elif kind == "test":
            if _get(doc, parts) != op["value"]:
                raise PatchError(f"test operation failed at {op.get('path')!r}")
        else:
            raise PatchError(f"unknown JSON patch operation {kind!r}", bad_request=True)
    return doc


# --- strategic merge patch ----------------------------------------------------------------------------------


def apply_strategic_merge_patch(target: Json, patch: Json) -> Json:
    if not isinstance(patch, dict):
        raise PatchError("a strategic merge patch must be a JSON object", bad_request=True)
    result = _merge_map(target if isinstance(target, dict) else {}, patch)
    return {} if result is None else result


def _merge_map(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any] | None:
    directive = patch.get(_DIRECTIVE)
    if directive == "delete":
        return None
    body = {k: v for k, v in patch.items() if k != _DIRECTIVE}
    if directive == "replace":
        replaced: dict[str, Any] = _strip_directives(body)
        return replaced
    if directive is not None:
        raise PatchError(f"unknown $patch directive {directive!r}", bad_request=True)
    result = copy.deepcopy(target)
    retain = body.pop(_RETAIN_KEYS, None)
    for key, value in body.items():
        if key.startswith(_ORDER_PREFIX):
            continue
        if key.startswith(_DELETE_PRIMITIVE_PREFIX):
            field = key.removeprefix(_DELETE_PRIMITIVE_PREFIX)
            if not isinstance(value, list):
                raise PatchError(f"{key} must be a list", bad_request=True)
            if isinstance(result.get(field), list):
                result[field] = [item for item in result[field] if item not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(result[key] if isinstance(result.get(key), dict) else {}, value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value
    if retain is not None:
        if not isinstance(retain, list):
            raise PatchError("$retainKeys must be a list", bad_request=True)
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(field: str, current: Json, patch: list[Any]) -> list[Any]:
    existing = current if isinstance(current, list) else []
    if field in SET_LISTS:
        merged = list(existing)
        merged.extend(item for item in patch if item not in merged)
        return merged
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(item, dict) for item in patch):
        return _strip_directives(patch)  # type: ignore[no-any-return]
    if any(item.get(_DIRECTIVE) == "replace" for item in patch):
        return [_strip_directives(item) for item in patch if item.get(_DIRECTIVE) != "replace"]
    merged = copy.deepcopy(existing)
    for item in patch:
        if key not in item:
            raise PatchError(f"an element of {field} lacks its merge key {key!r}", bad_request=True)
        position = next(
            (i for i, old in enumerate(merged) if isinstance(old, dict) and old.get(key) == item[key]), None
        )
        if item.get(_DIRECTIVE) == "delete":
            if position is not None:
                merged.pop(position)
            continue
        if position is None:
            merged.append(_strip_directives(item))
        else:
            updated = _merge_map(merged[position], item)
            if updated is None:
                merged.pop(position)
            else:
                merged[position] = updated
    return merged


def _strip_directives(value: Json) -> Json:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value
