"""Cambricon MLU (dynamic sMLU), hami-vendors §2: :class:`CambriconFamily` and its ``cambricon:`` section."""

from __future__ import annotations

from hami_common.vendors._family import DeviceFamily
from hami_common.vendors.cambricon.config import SECTION, CambriconConfig, parse_section
from hami_common.vendors.cambricon.family import CambriconFamily, devices_from_capacity, dsmlu_profile
from hami_common.vendors.cambricon.lock import LockAction, LockDecision, lock_decision
from hami_common.vendors.registry import FamilySource

__all__ = [
    "SECTION",
    "SOURCE",
    "CambriconConfig",
    "CambriconFamily",
    "LockAction",
    "LockDecision",
    "devices_from_capacity",
    "dsmlu_profile",
    "families",
    "lock_decision",
    "parse_section",
]


def families(config: CambriconConfig | None) -> tuple[DeviceFamily, ...]:
    """The family when the ``cambricon:`` section is present (see :mod:`.config` on the default), else none."""
    return () if config is None else (CambriconFamily(config),)


# named in pyproject.toml's "hami.vendors" entry points
SOURCE = FamilySource(SECTION, lambda raw: families(parse_section(raw)), plugin=f"{__name__}.plugin", rank=20)
