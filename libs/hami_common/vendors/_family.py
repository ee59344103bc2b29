"""What one device family (a HAMi backend) supplies to every service: the port the services loop over.

A family is known by its common word (``NVIDIA``, ``Ascend910B3``, ``MLU``, ``DCU``) and carries everything
HAMi keeps per vendor (hami-vendors §0.2, §4): its resource names and request parsing, the webhook's
per-container mutation, where its node devices come from (a register annotation or node capacity), its
handshake key, its node lock, Fit and node score, and the pod annotations a placement writes. The services
never name a family; they ask the configured registry (:mod:`hami_common.vendors`).

Everything here is pure: the values in are decoded Kubernetes objects, the values out are annotations,
resource maps and verdicts. Errors are :class:`~hami_common.errors.InvalidInput` (a request the webhook
refuses, with HAMi's message) or :class:`~hami_common.errors.AnnotationError` (a node annotation that does
not decode).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from hami_common.annotations.devices import ContainerDevice
from hami_common.resources import ContainerResources, DeviceRequest
from hami_common.scheduling.policy import PodPreferences
from hami_common.scheduling.usage import DeviceUsage, NodeUsage
from hami_common.scheduling.vendor import Vendor

__all__ = ["Admission", "DeviceFamily", "NodeLockSpec", "NodeView", "QuotaSpec"]


@dataclass(frozen=True, slots=True)
class NodeView:
    """The parts of a Node a family reads to find its devices."""

    name: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Admission:
    """The webhook's verdict on one container for one family (HAMi's ``MutateAdmission``).

    ``asks`` is whether the container asks for this family at all (the count resource in limits). The
    resource maps are the container's limits and requests after the family's rewrite (e.g. Ascend's template
    rounding); unchanged maps when nothing is rewritten.
    """

    asks: bool
    limits: Mapping[str, str]
    requests: Mapping[str, str]
    env: Mapping[str, str] = field(default_factory=dict)  # env vars to append (Ascend's overwriteEnv)
    runtime_class: str | None = None  # set on the pod when it has none
    # env a tenant may not keep in this container unless its namespace allows it (ours: NVIDIA's
    # CUDA_DISABLE_CONTROL would switch the interposer's limits off)
    guarded_env: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeLockSpec:
    """Which node annotation serialises binds for this family, and when a lock counts as stale.

    ``shared`` means HAMi's ``hami.io/mutex.lock`` (value ``ts,ns,name``, hami-protocol §2.7); otherwise the
    key holds a bare RFC 3339 time (Cambricon's ``cambricon.com/dsmlu.lock``).
    """

    key: str
    expiry: timedelta
    shared: bool
    # our allocator serves the family and takes its placements over the bus: on a node whose allocator is
    # ours the lock is not taken (it only lets HAMi's device plugin find its pod); the extender's in-memory
    # hand-off orders the binds instead
    bus_placed: bool = False


@dataclass(frozen=True, slots=True)
class QuotaSpec:
    """What namespace quota tracks for a family (hami-protocol §4.8, hami-vendors §0.2 "Webhook").

    A ResourceQuota's ``limits.<memory_name>`` and ``limits.<core_name>`` bound the namespace; a placed pod
    holds the collapsed devices :meth:`DeviceFamily.allocated` reads. ``memory_factor`` is the MiB of one unit
    of the memory resource, so the limit is multiplied by it (Cambricon's 256 MiB; HAMi applies it only
    when > 1).
    """

    memory_name: str
    core_name: str  # "" when the family has no core resource
    memory_factor: int


class DeviceFamily(Vendor, Protocol):
    """One HAMi backend. ``word``, ``owns`` and ``fit`` come from the placement engine's :class:`Vendor`."""

    @property
    def resource_names(self) -> tuple[str, ...]:
        """Every extended resource this family manages, the count resource first."""
        ...

    @property
    def handshake_key(self) -> str | None:
        """The node annotation of the generic handshake (hami-vendors §0.2), or None (Cambricon)."""
        ...

    @property
    def register_key(self) -> str | None:
        """The node annotation its device plugin registers the devices in, or None where :meth:`node_devices`
        reads them from elsewhere (Cambricon: the node's capacity)."""
        ...

    @property
    def node_lock(self) -> NodeLockSpec: ...

    @property
    def quota(self) -> QuotaSpec:
        """The resources and annotation the webhook's per-vendor quota pre-check reads."""
        ...

    def check(self, container: ContainerResources) -> None:
        """The webhook's quantity rule (ours), before :meth:`admit`: every managed quantity of the container, in
        limits and in requests, is one the family's request can hold; InvalidInput naming the resource and
        its range (answered 400, where a refusal of :meth:`admit` is HAMi's 500)."""
        ...

    def admit(self, container: ContainerResources, pod_annotations: Mapping[str, str]) -> Admission:
        """The webhook's per-container step; InvalidInput with HAMi's message when the request is refused."""
        ...

    def preferences(self, base: PodPreferences, pod_annotations: Mapping[str, str]) -> PodPreferences:
        """The pod's preferences for this family's fit: ``base`` (HAMi's generic policy annotations) with the
        use/nouse uuid and type lists read from this family's own keys (``cambricon.com/use-gpuuuid``,
        ``hygon.com/use-dcutype``, ``hami.io/use-<CommonWord>-uuid``). The caller passes the result as
        ``FitContext.prefs`` to :meth:`fit`."""
        ...

    def request(self, container: ContainerResources) -> DeviceRequest | None:
        """The container's request for this family (``GenerateResourceRequests``), None when it asks none."""
        ...

    def node_devices(self, node: NodeView) -> tuple[DeviceUsage, ...]:
        """The node's idle devices of this family; AnnotationError when its source is absent or malformed."""
        ...

    def score_node(self, node: NodeUsage, picked: Sequence[Sequence[ContainerDevice]]) -> float:
        """A raw bonus added to the node score for this placement (Ascend 910's HCCS grouping); 0 for most."""
        ...

    def pod_annotations(
        self, node: NodeUsage, picked: Sequence[Sequence[ContainerDevice]], pod_annotations: Mapping[str, str]
    ) -> Mapping[str, str]:
        """The annotations a placement writes for this family (``PatchAnnotations``), beside the generic
        ``hami.io/vgpu-node`` and ``hami.io/vgpu-time`` the binder writes for every pod. ``picked`` is one
        entry per container (init containers first), empty where a container got none of this family."""
        ...

    @property
    def owned_annotations(self) -> frozenset[str]:
        """The pod annotations only the system may write for this family: what a placement writes and what
        its device plugin trusts or records (a tenant setting one could steer the plugin to cards the
        scheduler never granted). The webhook denies tenants setting or changing them."""
        ...

    @property
    def user_annotations(self) -> frozenset[str]:
        """The pod annotations a tenant sets for this family (its use/nouse lists, Ascend's vnpu-mode): with
        :attr:`owned_annotations`, the keys the webhook knows when it names a misspelt one."""
        ...

    def allocated(self, pod_annotations: Mapping[str, str]) -> tuple[tuple[ContainerDevice, ...], ...]:
        """The cards of this family a placement gave the pod, per container (init first), read back from
        its ``…-devices-allocated`` annotation (what the ledger rebuilds from after a restart); ``()`` when
        the pod has none; AnnotationError when the value does not decode."""
        ...
