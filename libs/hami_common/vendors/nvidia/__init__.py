"""NVIDIA, hami-protocol §1-§4: :class:`NvidiaFamily`, the ``nvidia:`` section's family."""

from __future__ import annotations

from hami_common.vendors.nvidia.family import (
    DEFAULT_CORE_POLICY,
    DEVICE_LISTS,
    EXCLUSIVE_CORES,
    VISIBLE_NONE,
    NvidiaFamily,
)

__all__ = ["DEFAULT_CORE_POLICY", "DEVICE_LISTS", "EXCLUSIVE_CORES", "VISIBLE_NONE", "NvidiaFamily"]
