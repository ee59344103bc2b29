"""The ``cambricon:`` section of HAMi's device config (hami-vendors §2.1): three resource names, nothing else.

Enabled by default? HAMi's chart always renders this section (and puts the count name in
``managedResources``). We enable the family exactly when the section is present in the device config:
HAMi's own ConfigMap therefore switches it on, as in HAMi, while our default config (no section) keeps a
deployment that only runs NVIDIA from suddenly managing ``cambricon.com/vmlu`` after an upgrade. The
factory takes ``None`` for an absent section.
"""

from __future__ import annotations

import msgspec

from hami_common.vendors._common import check_resource_names, decode_section
from hami_common.vendors.cambricon.keys import MLU_CORES, MLU_COUNT, MLU_MEMORY

__all__ = ["SECTION", "CambriconConfig", "parse_section"]

SECTION = "cambricon"


class CambriconConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """HAMi's keys, the chart's defaults (HAMi: charts/hami/templates/scheduler/device-configmap.yaml:54-57)."""

    resource_count_name: str = MLU_COUNT
    resource_memory_name: str = MLU_MEMORY
    resource_core_name: str = MLU_CORES


def parse_section(raw: object) -> CambriconConfig:
    """The section as parsed YAML (a mapping; ``None`` for a bare ``cambricon:``) to a checked config."""
    config = decode_section({} if raw is None else raw, CambriconConfig, SECTION)
    check_resource_names(
        SECTION,
        {
            "resourceCountName": config.resource_count_name,
            "resourceMemoryName": config.resource_memory_name,
            "resourceCoreName": config.resource_core_name,
        },
    )
    return config
