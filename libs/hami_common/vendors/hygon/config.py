"""The ``hygon:`` section of HAMi's device config (hami-vendors §3.1).

Enabled exactly when the section is present, for the reason given in
:mod:`hami_common.vendors.cambricon.config`: HAMi's chart always renders it, our default config does not.
"""

from __future__ import annotations

import msgspec

from hami_common.errors import InvalidInput
from hami_common.vendors._common import check_resource_names, decode_section
from hami_common.vendors.hygon.keys import DCU_CORES, DCU_COUNT, DCU_MEMORY

__all__ = ["SECTION", "HygonConfig", "parse_section"]

SECTION = "hygon"


class HygonConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """HAMi's keys, the chart's defaults (HAMi: charts/hami/templates/scheduler/device-configmap.yaml:58-62)."""

    resource_count_name: str = DCU_COUNT
    resource_memory_name: str = DCU_MEMORY
    resource_core_name: str = DCU_CORES
    memory_factor: int = 1  # HAMi's built-in config leaves it 0, which means 1

    @property
    def factor(self) -> int:
        """The multiplier applied to memory requests: only a factor above 1 changes anything."""
        return self.memory_factor if self.memory_factor > 1 else 1


def parse_section(raw: object) -> HygonConfig:
    """The section as parsed YAML (a mapping; ``None`` for a bare ``hygon:``) to a checked config."""
    config = decode_section({} if raw is None else raw, HygonConfig, SECTION)
    check_resource_names(
        SECTION,
        {
            "resourceCountName": config.resource_count_name,
            "resourceMemoryName": config.resource_memory_name,
            "resourceCoreName": config.resource_core_name,
        },
    )
    if config.memory_factor < 0:
        raise InvalidInput(f"{SECTION}.memoryFactor: {config.memory_factor} is below 0")
    return config
