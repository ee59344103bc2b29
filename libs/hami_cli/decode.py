"""``hami decode KEY VALUE``: show what a HAMi annotation value means, as JSON."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Final

import msgspec

from hami_common import annotations as ann

__all__ = ["DECODERS", "decode"]


def _pod_devices(value: str, key: str) -> object:
    return [[dataclasses.asdict(d) for d in container] for container in ann.decode_pod_devices(value, key)]


def _node_lock(value: str, key: str) -> object:
    lock = ann.decode_node_lock(value, key)
    return {"locked_at": ann.encode_rfc3339(lock.locked_at), "namespace": lock.namespace, "name": lock.name}


DECODERS: Final[dict[str, Callable[[str, str], object]]] = {
    ann.DEVICES_TO_ALLOCATE: _pod_devices,
    ann.DEVICES_ALLOCATED: _pod_devices,
    ann.NODE_REGISTER: lambda v, k: ann.decode_node_devices(v, k),
    ann.NODE_SCORE: lambda v, k: ann.decode_pair_scores(v, k),
    ann.NODE_LOCK: _node_lock,
    ann.BIND_TIME: lambda v, k: ann.encode_rfc3339(ann.decode_unix_seconds(v, k)),
    ann.VGPU_TIME: lambda v, k: ann.encode_rfc3339(ann.decode_unix_seconds(v, k)),
}


def decode(key: str, value: str) -> bytes:
    """The decoded value as indented JSON; ``AnnotationError`` for a malformed value, KeyError for a key."""
    return msgspec.json.format(msgspec.json.encode(DECODERS[key](value, key)), indent=2)
