"""The guard on scheduler-owned annotations (ARCHITECTURE §3): tenants may neither set nor change them.

A tenant who writes ``hami.io/vgpu-devices-to-allocate`` could make the device plugin hand out GPUs the
scheduler never granted, so only the system's own service accounts may touch these keys.
"""

from __future__ import annotations

from collections.abc import Mapping

from hami_common.annotations import SCHEDULER_OWNED

__all__ = ["touched_reserved_annotation"]


def touched_reserved_annotation(
    new: Mapping[str, str], old: Mapping[str, str] | None, also: frozenset[str] = frozenset()
) -> str | None:
    """The first scheduler-owned key (sorted) that ``new`` sets (CREATE: ``old`` is None) or changes; ``also``
    adds the configured device families' own keys (their device lists, Ascend's ``huawei.com/<word>``,
    Cambricon's ``CAMBRICON_DSMLU_*``), which their device plugins trust as HAMi's trusts ours.

    On UPDATE a key counts as changed when it is added, given another value, or removed.
    """
    owned = SCHEDULER_OWNED | also
    if old is None:
        found = sorted(k for k in owned if k in new)
    else:
        found = sorted(k for k in owned if new.get(k) != old.get(k))
    return found[0] if found else None
