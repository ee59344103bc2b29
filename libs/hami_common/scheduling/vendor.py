"""The vendor interface of the placement engine, like HAMi's device interface (hami-protocol §4.5-4.7).

A vendor is known by its common word (``NVIDIA``), says which registered cards are its own, and fits one
container's request to an ordered list of its cards. NVIDIA is the first backend
(:mod:`hami_common.scheduling.nvidia`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from hami_common.annotations.devices import ContainerDevice
from hami_common.annotations.mig import MigAllocation
from hami_common.resources import DeviceRequest
from hami_common.scheduling.policy import PodPreferences
from hami_common.scheduling.quota import NamespaceQuota
from hami_common.scheduling.reason import Reason
from hami_common.scheduling.usage import DeviceUsage, NodeUsage, collapse_devices

__all__ = ["ContainerFit", "FitContext", "Vendor"]


@dataclass(frozen=True, slots=True)
class ContainerFit:
    """One container's verdict on one node: the cards granted, or per-card rejection counts."""

    devices: tuple[ContainerDevice, ...] = ()
    # the MIG instances among ``devices``: ``device_index`` is the position there, ``container_index`` is 0
    # until the pod's fit (:func:`..placement.fit_node`) places the container
    mig: tuple[MigAllocation, ...] = ()
    rejected: Mapping[Reason, int] = field(default_factory=dict)
    checked: int = 0  # cards passed to the fit: the ``n`` of ``k/n Reason``

    @property
    def fits(self) -> bool:
        return bool(self.devices)


@dataclass(frozen=True, slots=True)
class FitContext:
    """What a fit may read besides the cards: the pod's preferences, the node, the namespace quota."""

    prefs: PodPreferences
    node: NodeUsage
    quota: NamespaceQuota | None = None
    memory_factor: int = 1
    prior_init: tuple[tuple[ContainerDevice, ...], ...] = ()  # this pod's earlier containers (§4.8)
    prior_app: tuple[tuple[ContainerDevice, ...], ...] = ()
    fitting_init: bool = False  # whether the container being fitted is an init container

    def quota_fits(self, picked: Sequence[ContainerDevice]) -> bool:
        """Whether the pod's devices so far plus ``picked`` for this container, collapsed, fit the quota."""
        if self.quota is None:
            return True
        init = (*self.prior_init, tuple(picked)) if self.fitting_init else self.prior_init
        app = self.prior_app if self.fitting_init else (*self.prior_app, tuple(picked))
        charges = collapse_devices(init, app)
        return self.quota.fits(sum(c.usedmem for c in charges), sum(c.usedcores for c in charges), self.memory_factor)


class Vendor(Protocol):
    @property
    def word(self) -> str: ...

    def owns(self, dev: DeviceUsage) -> bool: ...

    def fit(self, devices: Sequence[DeviceUsage], request: DeviceRequest, ctx: FitContext) -> ContainerFit: ...
