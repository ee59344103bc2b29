"""Hygon DCU, hami-vendors §3: :class:`HygonFamily`, its ``hygon:`` section, register codec, Allocate contract."""

from __future__ import annotations

from hami_common.vendors._family import DeviceFamily
from hami_common.vendors.hygon.allocate import (
    AllocateContract,
    DeviceNode,
    DrmNodes,
    Mount,
    VdevSlot,
    allocate_contract,
    needs_vdcu,
    vdev_conf,
)
from hami_common.vendors.hygon.config import SECTION, HygonConfig, parse_section
from hami_common.vendors.hygon.family import HygonFamily
from hami_common.vendors.hygon.register import decode_register, encode_register
from hami_common.vendors.registry import FamilySource

__all__ = [
    "SECTION",
    "SOURCE",
    "AllocateContract",
    "DeviceNode",
    "DrmNodes",
    "HygonConfig",
    "HygonFamily",
    "Mount",
    "VdevSlot",
    "allocate_contract",
    "decode_register",
    "encode_register",
    "families",
    "needs_vdcu",
    "parse_section",
    "vdev_conf",
]


def families(config: HygonConfig | None) -> tuple[DeviceFamily, ...]:
    """The family when the ``hygon:`` section is present (see :mod:`.config` on the default), else none."""
    return () if config is None else (HygonFamily(config),)


# named in pyproject.toml's "hami.vendors" entry points
SOURCE = FamilySource(SECTION, lambda raw: families(parse_section(raw)), plugin=f"{__name__}.plugin", rank=30)
