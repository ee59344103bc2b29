"""Why a card or a node was rejected: HAMi's wire words, rendered once (hami-protocol §4.7).

A fit check returns counts of :class:`Reason` per card; :func:`render_reasons` turns them into HAMi's
``"k/n Reason, …"`` text, entries sorted as strings, only at the edge that reports them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = ["NODE_REASONS", "Reason", "render_reasons"]


class Reason(enum.StrEnum):
    """Per-card and per-node rejection reasons; values are HAMi's exact strings."""

    CARD_NOT_HEALTH = "CardNotHealth"
    CARD_CORDONED = "CardCordoned"
    CARD_TYPE_MISMATCH = "CardTypeMismatch"
    NUMA_NOT_FIT = "NumaNotFit"
    CARD_UUID_MISMATCH = "CardUuidMismatch"
    CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
    RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
    CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
    CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
    CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
    CARD_NOT_FOUND_CUSTOM_FILTER_RULE = "CardNotFoundCustomFilterRule"
    CARD_MIG_TOPOLOGY_INFEASIBLE = "CardMigTopologyInfeasible"
    MODE_NOT_FIT = "ModeNotFit"  # Ascend: a hami-core pod on a node without hami-vnpu-core
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST = "AllocatedCardsInsufficientRequest"
    # Node-level reasons: rendered bare, without a count.
    NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
    NODE_UNREGISTERED = "node unregistered"
    DEVICE_TYPE_NOT_FOUND = "Device type not found"
    # Ours: the cards a preemption freed are kept for the pod kube-scheduler nominated to this node.
    NODE_NOMINATED_FOR_OTHER_POD = "node nominated for a more important pod"


NODE_REASONS = frozenset(
    {
        Reason.NODE_INSUFFICIENT_DEVICE,
        Reason.NODE_UNREGISTERED,
        Reason.DEVICE_TYPE_NOT_FOUND,
        Reason.NODE_NOMINATED_FOR_OTHER_POD,
    }
)


def render_reasons(counts: Mapping[Reason, int], total: int) -> str:
    """HAMi's ``GenReason``: ``"<count>/<total> <Reason>"`` entries sorted as strings, joined by ``", "``.

    A node-level reason is rendered bare (``NodeInsufficientDevice``, ``node unregistered``). A zero count is
    left out, except ``AllocatedCardsInsufficientRequest``: Ascend 910C's pairing reports how many NPUs it
    could pair, and HAMi renders ``0/<n>`` when it paired none.
    """
    bare = sorted(str(r) for r in counts if r in NODE_REASONS)
    if bare:
        return ", ".join(bare)
    return ", ".join(
        sorted(
            f"{n}/{total} {r}"
            for r, n in counts.items()
            if n > 0 or (n == 0 and r is Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST)
        )
    )
