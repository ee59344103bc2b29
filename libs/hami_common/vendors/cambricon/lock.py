"""Cambricon's node lock ``cambricon.com/dsmlu.lock`` (hami-vendors §2.2): a bare RFC 3339 time, two minutes.

HAMi's ``LockNode`` for MLU, as a pure decision: the caller reads the node's annotation, asks
:func:`lock_decision`, and performs the patch it names (a merge patch of ``value``; on ``replace`` HAMi
first releases with a merge-patch ``null``, then sets). Cambricon's device plugin removes the lock after a
successful Allocate; a bind rollback releases it with a merge-patch ``null``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from hami_common.annotations.timestamps import decode_rfc3339, encode_rfc3339
from hami_common.vendors.cambricon.keys import LOCK_EXPIRY, NODE_LOCK

__all__ = ["LockAction", "LockDecision", "lock_decision"]


class LockAction(enum.StrEnum):
    TAKE = "take"  # no lock: set it
    REPLACE = "replace"  # a stale lock: release it, then set it
    REFUSE = "refuse"  # a lock younger than two minutes: another bind holds the node


@dataclass(frozen=True, slots=True)
class LockDecision:
    action: LockAction
    value: str | None = None  # the annotation value to write (TAKE, REPLACE)
    message: str | None = None  # HAMi's refusal text (REFUSE)

    @property
    def granted(self) -> bool:
        return self.action is not LockAction.REFUSE


def lock_decision(node_name: str, current: str | None, now: datetime) -> LockDecision:
    """What to do with the node's current lock value; an unparsable value is an AnnotationError, as in HAMi.

    ``now`` must be timezone-aware (it is written as RFC 3339 with its offset).
    """
    value = encode_rfc3339(now)
    if current is None:
        return LockDecision(LockAction.TAKE, value=value)
    locked_at = decode_rfc3339(current, NODE_LOCK)
    if now - locked_at < LOCK_EXPIRY:
        return LockDecision(LockAction.REFUSE, message=f"node {node_name} has been locked within 2 minutes")
    return LockDecision(LockAction.REPLACE, value=value)
