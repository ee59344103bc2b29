"""Device families: the port every vendor implements (:mod:`._family`), NVIDIA's included, and their backends.

NVIDIA's knobs are the top level of HAMi's device config (``nvidia:``, the placement engine's default), so
its family is built from them by :func:`device_families`; the others come from their own sections through
the registry (:mod:`.registry`). Services take the whole tuple and loop over it; none names a family.
"""

from __future__ import annotations

from collections.abc import Sequence

from hami_common.resources import ResourceConfig
from hami_common.vendors._family import Admission, DeviceFamily, NodeLockSpec, NodeView, QuotaSpec
from hami_common.vendors.nvidia import DEFAULT_CORE_POLICY, NvidiaFamily

__all__ = [
    "DEFAULT_CORE_POLICY",
    "Admission",
    "DeviceFamily",
    "NodeLockSpec",
    "NodeView",
    "QuotaSpec",
    "device_families",
]


def device_families(
    resources: ResourceConfig | None = None,
    others: Sequence[DeviceFamily] = (),
    *,
    gpu_core_policy: str = DEFAULT_CORE_POLICY,
    overwrite_env: bool = False,
    runtime_class_name: str = "",
) -> tuple[DeviceFamily, ...]:
    """Every family a service serves, in HAMi's order: the default family from the device config's top-level
    knobs (``resources`` and the webhook's three), then ``others`` (the sections' families)."""
    default = NvidiaFamily(
        config=resources or ResourceConfig(),
        gpu_core_policy=gpu_core_policy,
        overwrite_env=overwrite_env,
        runtime_class_name=runtime_class_name,
    )
    return (default, *others)
