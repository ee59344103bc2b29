"""The guard on scheduler-owned annotations (ARCHITECTURE §3): tenants may neither set nor change them.

A tenant who writes ``hami.io/vgpu-devices-to-allocate`` could make the device plugin hand out GPUs the
scheduler never granted, so only the system's own service accounts may touch these keys.
"""

from __future__ import annotations

from collections.abc import Mapping

from hami_common.annotations import SCHEDULER_OWNED

__all__ = ["touched_reserved_annotation"]


def touched_reserved_annotation(new: Mapping[str, str], old: Mapping[str, str] | None) -> str | None:
    """The first scheduler-owned key (sorted) that ``new`` sets (CREATE: ``old`` is None) or changes.

    On UPDATE a key counts as changed when it is added, given another value, or removed.
    """
    if old is None:
        found = sorted(k for k in SCHEDULER_OWNED if k in new)
    else:
        found = sorted(k for k in SCHEDULER_OWNED if new.get(k) != old.get(k))
    return found[0] if found else None
