"""Device families beyond the placement engine's NVIDIA backend: the port (:mod:`._family`) and its backends."""

from __future__ import annotations

from hami_common.vendors._family import Admission, DeviceFamily, NodeLockSpec, NodeView, QuotaSpec

__all__ = ["Admission", "DeviceFamily", "NodeLockSpec", "NodeView", "QuotaSpec"]
