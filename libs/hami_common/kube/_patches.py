"""Merge patches the way HAMi writes them (hami-protocol §2.1, §2.7): pure builders, no I/O.

Annotations are patched with a JSON merge patch of ``metadata.annotations``; ``None`` removes a key. A pod
patch that sets a non-empty ``hami.io/vgpu-node`` also sets the label of the same name, so the device
plugin and the monitor can select pods by node. A ``resource_version`` turns the patch into an optimistic
write: the apiserver answers 409 Conflict if the object changed since it was read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from hami_common.annotations import VGPU_NODE

__all__ = ["AnnotationChanges", "MetadataPatch", "PatchMeta", "node_annotation_patch", "pod_annotation_patch"]

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
