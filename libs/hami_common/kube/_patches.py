"""Merge patches the way HAMi writes them (hami-protocol §2.1, §2.7): pure builders, no I/O.

Annotations are patched with a JSON merge patch of ``metadata.annotations``; ``None`` removes a key. A pod
patch that sets a non-empty ``hami.io/vgpu-node`` also sets the label of the same name, so the device
plugin and the monitor can select pods by node. A ``resource_version`` turns the patch into an optimistic
write: the apiserver answers 409 Conflict if the object changed since it was read.

:func:`guarded_annotation_patch` is the narrower condition: a JSON patch (RFC 6902) whose ``test`` operations
hold the write to the object read (its uid) and to the values it read of the keys it changes, so a write by
someone else to another part of the object (the kubelet's status) does not refuse it. kube-apiserver applies
it to the current object and answers 422 Invalid when a test fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from hami_common.annotations import VGPU_NODE

__all__ = [
    "AnnotationChanges",
    "JsonPatchOp",
    "MetadataPatch",
    "PatchMeta",
    "guarded_annotation_patch",
    "json_patch_body",
    "node_annotation_patch",
    "pod_annotation_patch",
]

AnnotationChanges = Mapping[str, str | None]  # key -> new value, or None to remove the key


class PatchMeta(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    annotations: dict[str, str | None] = msgspec.field(default_factory=dict)
    labels: dict[str, str | None] = msgspec.field(default_factory=dict)
    resource_version: str = ""


class MetadataPatch(msgspec.Struct, frozen=True, kw_only=True):
    """``{"metadata": {...}}``: the body of a JSON merge patch of annotations and labels."""

    metadata: PatchMeta

    def to_json(self) -> dict[str, Any]:
        """The patch as JSON builtins, as the client's ``body`` argument expects."""
        builtins: dict[str, Any] = msgspec.to_builtins(self)
        return builtins


def node_annotation_patch(changes: AnnotationChanges, *, resource_version: str = "") -> MetadataPatch:
    return MetadataPatch(metadata=PatchMeta(annotations=dict(changes), resource_version=resource_version))


def pod_annotation_patch(changes: AnnotationChanges, *, resource_version: str = "") -> MetadataPatch:
    node = changes.get(VGPU_NODE)
    labels: dict[str, str | None] = {VGPU_NODE: node} if node else {}
    return MetadataPatch(
        metadata=PatchMeta(annotations=dict(changes), labels=labels, resource_version=resource_version)
    )


class JsonPatchOp(msgspec.Struct, frozen=True, omit_defaults=True):
    """One operation of a JSON patch (RFC 6902); ``value`` is left out of a ``remove``."""

    op: str
    path: str
    value: str | dict[str, str] | msgspec.UnsetType = msgspec.UNSET


def _pointer(*parts: str) -> str:
    """A JSON pointer (RFC 6901): ``~`` and ``/`` of each part escaped."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _map_ops(field: str, current: Mapping[str, str], changes: AnnotationChanges) -> tuple[list[JsonPatchOp], bool]:
    """The operations that turn ``current`` (one metadata map as read) into it with ``changes``; True when
    they replace the whole map (the copy read had none), which only the resourceVersion can guard."""
    sets = {k: v for k, v in changes.items() if v is not None}
    if not current:
        return ([JsonPatchOp("add", _pointer("metadata", field), sets)] if sets else []), bool(sets)
    ops = [JsonPatchOp("add", _pointer("metadata", field, k), v) for k, v in sets.items()]
    ops += [
        JsonPatchOp("remove", _pointer("metadata", field, k)) for k, v in changes.items() if v is None and k in current
    ]
    return ops, False


def guarded_annotation_patch(
    read: Mapping[str, str],
    *,
    uid: str,
    resource_version: str,
    guards: Sequence[str],
    changes: AnnotationChanges,
    labels: Mapping[str, str] | None = None,
    read_labels: Mapping[str, str] | None = None,
) -> list[JsonPatchOp]:
    """A JSON patch of annotations (and labels) that applies only while the object is the one read.

    ``read`` (and ``read_labels``) are the object's annotations (labels) as read; each key of ``guards`` is
    tested against its value there, and a guarded key the copy lacked (absence cannot be tested), or a map
    the copy lacked altogether, is guarded by the whole object's ``resource_version`` instead. A ``None``
    change removes a key the copy has (removing a missing key would fail the patch)."""
    ops = [JsonPatchOp("test", _pointer("metadata", "uid"), uid)]
    by_version = False
    for key in guards:
        if key in read:
            ops.append(JsonPatchOp("test", _pointer("metadata", "annotations", key), read[key]))
        else:
            by_version = True
    writes, whole = _map_ops("annotations", read, changes)
    by_version = by_version or whole
    if labels:
        label_writes, whole = _map_ops("labels", read_labels or {}, labels)
        writes += label_writes
        by_version = by_version or whole
    if by_version:
        ops.append(JsonPatchOp("test", _pointer("metadata", "resourceVersion"), resource_version))
    return ops + writes


def json_patch_body(ops: Sequence[JsonPatchOp]) -> list[dict[str, Any]]:
    """The patch as JSON builtins, as the client's ``body`` argument expects."""
    body: list[dict[str, Any]] = msgspec.to_builtins(list(ops))
    return body
