"""Huawei Ascend NPUs (910A, 910B2/B3/B4/B4-1, 910C, 310P): one device family per chip model (hami-vendors §1)."""

from __future__ import annotations

from hami_common.vendors.ascend.config import (
    CHART_CHIPS,
    VNPUS_SECTION,
    AscendConfig,
    ChipConfig,
    Template,
    parse_vnpus,
)
from hami_common.vendors.ascend.family import AscendFamily, NpuRuntime, families
from hami_common.vendors.registry import FamilySource

__all__ = [
    "CHART_CHIPS",
    "SOURCE",
    "VNPUS_SECTION",
    "AscendConfig",
    "AscendFamily",
    "ChipConfig",
    "NpuRuntime",
    "Template",
    "families",
    "parse_vnpus",
]


# named in pyproject.toml's "hami.vendors" entry points
SOURCE = FamilySource(VNPUS_SECTION, lambda raw: families(parse_vnpus(raw)), plugin=f"{__name__}.plugin", rank=10)
