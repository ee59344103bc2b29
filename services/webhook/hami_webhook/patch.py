"""The webhook's changes to a pod, and their RFC 6902 JSON Patch.

Rules record what they change in :class:`PodEdits` (typed, one field per kind of change); the patch is
rendered once against the original :class:`~hami_webhook.podview.PodView`, so each op targets a path that
exists in the original document: a missing ``resources``, ``limits``, ``env`` or ``annotations`` is added
whole, an existing one is extended member by member (RFC 6901 escaping: ``/`` in a key is ``~1``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

import msgspec

from hami_common.dra import ClaimReference, PodResourceClaim
from hami_webhook.podview import ContainerSpec, EnvVar, PodView, Resources

__all__ = [
    "ContainerEdit",
    "ContainerList",
    "PatchOp",
    "PodEdits",
    "encode_patch",
    "escape_pointer",
    "render_patch",
]

ADD: Final = "add"
REMOVE: Final = "remove"
REPLACE: Final = "replace"

PatchValue = (
    str
    | dict[str, str]
    | Resources
    | EnvVar
    | tuple[EnvVar, ...]
    | ClaimReference  # the DRA mode's (hami_webhook.dra): a container's claim, the pod's claim entries
    | tuple[ClaimReference, ...]
    | PodResourceClaim
    | tuple[PodResourceClaim, ...]
)


class ContainerList(enum.StrEnum):
    """The pod spec's container lists, by their JSON names (HAMi's order: init containers first)."""

    INIT = "initContainers"
    APP = "containers"


class PatchOp(msgspec.Struct, frozen=True, omit_defaults=True):
    op: str
    path: str
    value: PatchValue | msgspec.UnsetType = msgspec.UNSET


def escape_pointer(token: str) -> str:
    """One JSON Pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


@dataclass(slots=True)
class ContainerEdit:
    """What the rules change in one container: limits and requests set, env entries removed (indices), env
    appended."""

    limits: dict[str, str] = field(default_factory=dict)
    requests: dict[str, str] = field(default_factory=dict)  # a family's rewrite (Ascend's rounded memory)
    env_removed: list[int] = field(default_factory=list)
    env_added: list[EnvVar] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.limits or self.requests or self.env_removed or self.env_added)


@dataclass(slots=True)
class PodEdits:
    scheduler_name: str | None = None
    runtime_class_name: str | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    containers: dict[tuple[ContainerList, int], ContainerEdit] = field(default_factory=dict)

    def container(self, which: ContainerList, index: int) -> ContainerEdit:
        edit = self.containers.get((which, index))
        if edit is None:
            edit = self.containers[(which, index)] = ContainerEdit()
        return edit

    @property
    def empty(self) -> bool:
        return (
            self.scheduler_name is None
            and self.runtime_class_name is None
            and not self.annotations
            and all(e.empty for e in self.containers.values())
        )


def _quantity_ops(prefix: str, kind: str, original: dict[str, str] | None, edited: dict[str, str]) -> list[PatchOp]:
    """``resources/<kind>`` (limits or requests) set to the edited values, the map added when absent."""
    if not edited:
        return []
    if original is None:
        return [PatchOp(op=ADD, path=f"{prefix}/resources/{kind}", value=dict(edited))]
    path = f"{prefix}/resources/{kind}"
    return [
        PatchOp(op=REPLACE if key in original else ADD, path=f"{path}/{escape_pointer(key)}", value=quantity)
        for key, quantity in edited.items()
    ]


def _container_ops(prefix: str, ctr: ContainerSpec, edit: ContainerEdit) -> list[PatchOp]:
    ops: list[PatchOp] = []
    res = ctr.resources
    if res is None and (edit.limits or edit.requests):
        whole = Resources(limits=dict(edit.limits) or None, requests=dict(edit.requests) or None)
        ops.append(PatchOp(op=ADD, path=f"{prefix}/resources", value=whole))
    elif res is not None:
        ops.extend(_quantity_ops(prefix, "limits", res.limits, edit.limits))
        ops.extend(_quantity_ops(prefix, "requests", res.requests, edit.requests))
    for index in sorted(set(edit.env_removed), reverse=True):
        ops.append(PatchOp(op=REMOVE, path=f"{prefix}/env/{index}"))
    if edit.env_added:
        if not ctr.env:
            ops.append(PatchOp(op=ADD, path=f"{prefix}/env", value=tuple(edit.env_added)))
        else:
            ops.extend(PatchOp(op=ADD, path=f"{prefix}/env/-", value=entry) for entry in edit.env_added)
    return ops


def render_patch(pod: PodView, edits: PodEdits) -> tuple[PatchOp, ...]:
    """The JSON Patch that turns the original pod into the edited one; empty when nothing changed."""
    ops: list[PatchOp] = []
    if edits.annotations:
        if pod.metadata.annotations is None:
            ops.append(PatchOp(op=ADD, path="/metadata/annotations", value=dict(edits.annotations)))
        else:
            for key, text in edits.annotations.items():
                verb = REPLACE if key in pod.metadata.annotations else ADD
                ops.append(PatchOp(op=verb, path=f"/metadata/annotations/{escape_pointer(key)}", value=text))
    lists = {ContainerList.INIT: pod.spec.init_containers, ContainerList.APP: pod.spec.containers}
    for (which, index), edit in edits.containers.items():  # recorded in HAMi's order: init containers first
        if not edit.empty:
            ops.extend(_container_ops(f"/spec/{which}/{index}", lists[which][index], edit))
    if edits.runtime_class_name is not None:
        ops.append(PatchOp(op=ADD, path="/spec/runtimeClassName", value=edits.runtime_class_name))
    if edits.scheduler_name is not None and edits.scheduler_name != pod.spec.scheduler_name:
        verb = ADD if pod.spec.scheduler_name is None else REPLACE
        ops.append(PatchOp(op=verb, path="/spec/schedulerName", value=edits.scheduler_name))
    return tuple(ops)


_ENCODER: Final = msgspec.json.Encoder()


def encode_patch(ops: tuple[PatchOp, ...]) -> bytes:
    return _ENCODER.encode(ops)
