"""The node lock ``hami.io/mutex.lock`` value (hami-protocol §2.7, §4.11).

``<RFC 3339 time>,<namespace>,<pod name>``; a legacy value is a bare RFC 3339 time with no holder.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from hami_common.annotations.keys import NODE_LOCK
from hami_common.annotations.timestamps import decode_rfc3339, encode_rfc3339
from hami_common.errors import AnnotationError

__all__ = ["NodeLock", "decode_node_lock", "encode_node_lock"]


@dataclass(frozen=True, slots=True)
class NodeLock:
    locked_at: datetime
    namespace: str = ""  # empty for a legacy lock, whose holder is unknown
    name: str = ""

    def held_by(self, namespace: str, name: str) -> bool:
        return (self.namespace, self.name) == (namespace, name)


def encode_node_lock(lock: NodeLock) -> str:
    if "," in lock.namespace or "," in lock.name:
        raise ValueError("namespace and name cannot hold ','")
    return f"{encode_rfc3339(lock.locked_at)},{lock.namespace},{lock.name}"


def decode_node_lock(value: str, key: str = NODE_LOCK) -> NodeLock:
    parts = value.split(",")
    if len(parts) == 1:
        return NodeLock(locked_at=decode_rfc3339(parts[0], key))
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise AnnotationError(key, f"expected '<time>,<namespace>,<name>', got {value!r}")
    return NodeLock(locked_at=decode_rfc3339(parts[0], key), namespace=parts[1], name=parts[2])
