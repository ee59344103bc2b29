"""Whether a node's cards may be scheduled on: HAMi's CheckHealth with the NVIDIA wrapper (hami-protocol §2.4).

Pure: the caller passes the handshake annotation, the registration text, the node's allocatable GPU count,
what it remembered of the node last time (:class:`NodeReport`) and ``now`` in the scheduler's local zone;
it gets back the verdict, whether to write ``Requesting_<now>``, and what to remember next time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from hami_common.annotations import check_handshake
from hami_common.errors import InvalidInput
from hami_common.quantity import value

__all__ = ["NodeHealth", "NodeReport", "allocatable_gpus", "node_health"]


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What the scheduler remembers of a node between checks: HAMi's reported count and register text."""

    gpus: int = 0
    register: str = ""


@dataclass(frozen=True, slots=True)
class NodeHealth:
    healthy: bool  # False: NodeCleanUp (remove the handshake) and drop the node's cards
    write_handshake: bool  # the handshake is absent or foreign: write Requesting_<now>
    changed: bool  # HAMi's needUpdate: the cards are (re)read from the registration
    report: NodeReport  # remember this for the next check


def allocatable_gpus(allocatable: Mapping[str, str], resource: str) -> int:
    """``status.allocatable[resource]`` as a count; absent or unreadable counts as 0, as in HAMi."""
    text = allocatable.get(resource)
    if not text:
        return 0
    try:
        return max(0, value(text))  # Quantity.Value(): rounded up
    except InvalidInput:
        return 0


def node_health(
    handshake: str | None, register: str, allocatable: int, previous: NodeReport, now: datetime
) -> NodeHealth:
    """HAMi's NVIDIA CheckHealth. The handshake rule runs first, so its write happens in every branch; then:
    no GPUs allocatable after some were reported is unhealthy (and forgets the report); a changed count,
    or a changed registration text, asks for the cards to be read again."""
    verdict = check_handshake(handshake, now, allocatable)
    write = verdict.need_update
    if allocatable == 0:
        if previous.gpus == 0:
            return NodeHealth(verdict.healthy, write, verdict.need_update, NodeReport(0, register))
        return NodeHealth(False, write, False, NodeReport())
    if allocatable != previous.gpus:
        return NodeHealth(True, write, True, NodeReport(allocatable, register))
    if register != previous.register:
        return NodeHealth(verdict.healthy, write, True, NodeReport(allocatable, register))
    return NodeHealth(verdict.healthy, write, verdict.need_update, previous)
