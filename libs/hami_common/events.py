"""The messages on the bus (ARCHITECTURE §4): frozen msgspec Structs, encoded with msgpack.

Every message carries ``schema``, the version of its own layout; a consumer that meets a newer
schema still decodes the fields it knows (unknown fields are ignored) and can tell it is behind.
Times are integers in nanoseconds since the epoch (``*_ns``); memory is in bytes (``*_bytes``) or MiB
(``*_mib``) as each field's name says. Trace context travels in NATS headers, never in the body.
"""

from __future__ import annotations

from typing import Final, TypeAlias

import msgspec

from hami_common.annotations.mig import MigAllocation
from hami_common.annotations.registration import DeviceInfo

__all__ = [
    "SCHEMA_VERSION",
    "AdmissionEvent",
    "AdmissionMessage",
    "AllocationResult",
    "BusEvent",
    "ContainerPlacement",
    "DeviceSample",
    "FilterRefusal",
    "NodeInventory",
    "NodePods",
    "PlacedDevice",
    "PlacementDecision",
    "PodEnded",
    "QuotaResource",
    "QuotaUsage",
    "RefusalReason",
    "UsageMessage",
    "UsageSample",
]

SCHEMA_VERSION: Final = 1


class BusEvent(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every bus message."""

    schema: int = SCHEMA_VERSION


class AdmissionEvent(BusEvent, frozen=True, kw_only=True, tag="admission"):
    """The webhook's verdict on one pod, published on ``hami.admission.<namespace>``."""

    pod_uid: str
    namespace: str
    name: str
    allowed: bool
    mutated: bool = False
    gpu_containers: int = 0
    reason: str = ""
    at_ns: int


class QuotaResource(msgspec.Struct, frozen=True, kw_only=True):
    """One tracked quota resource of a namespace (HAMi's ``quota_name``), in the resource's own unit."""

    name: str  # e.g. "nvidia.com/gpumem" (MiB) or "nvidia.com/gpucores" (percent of a card)
    used: int
    limit: int | None = None  # None: no ResourceQuota sets limits.<name>


class QuotaUsage(BusEvent, frozen=True, kw_only=True, tag="quota"):
    """A namespace's GPU quota as the webhook's caches hold it, on ``hami.admission.<namespace>``.

    A whole snapshot, sent when it changes and periodically: a consumer that missed one (core NATS keeps
    nothing) is right again at the next. No resources: the namespace no longer has a GPU quota.
    """

    namespace: str
    resources: tuple[QuotaResource, ...] = ()
    at_ns: int


class PlacedDevice(msgspec.Struct, frozen=True, kw_only=True):
    """One physical GPU granted to one container (a ``hami.io/vgpu-devices-allocated`` entry)."""

    uuid: str
    type: str
    usedmem_mib: int
    usedcores: int


class ContainerPlacement(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    init: bool = False
    devices: tuple[PlacedDevice, ...] = ()
    priority: int | None = None
    # This container's hami.io/vgpu-mig-allocations entries (scheduler-written fields only): a MIG container's
    # staged answer needs the profile and placement of each instance the device plugin will create.
    mig: tuple[MigAllocation, ...] = ()


class PlacementDecision(BusEvent, frozen=True, kw_only=True, tag="placement"):
    """The extender's bind of a pod to a node and GPUs, on JetStream ``hami.placement.<node>``.

    Containers are listed as in the pod annotations: init containers first, one entry each.
    """

    pod_uid: str
    namespace: str
    name: str
    node: str
    containers: tuple[ContainerPlacement, ...]
    bind_time_ns: int
    # The extender's timings for this pod, when it measures them (the metrics service's latency histograms).
    filter_ns: int | None = None  # the /filter call that chose the node
    bind_ns: int | None = None  # the /bind call, from request to published decision
    handoff_wait_ns: int | None = None  # of which waiting for the node hand-off (the previous pod's Allocate)


class AllocationResult(BusEvent, frozen=True, kw_only=True, tag="allocated"):
    """The device plugin's answer to one Allocate, on ``hami.allocated.<node>``."""

    pod_uid: str
    namespace: str
    name: str
    node: str
    container: str
    ok: bool
    staged: bool  # served from the staging store (True) or by the annotation fallback (False)
    device_uuids: tuple[str, ...] = ()
    reason: str = ""
    at_ns: int
    allocate_ns: int | None = None  # how long the plugin took to answer, when it measures it
    mig: tuple[MigAllocation, ...] = ()  # this container's MIG instances, with their runtime ids


class NodeInventory(BusEvent, frozen=True, kw_only=True, tag="inventory"):
    """A node's registered GPUs, on ``hami.inventory.<node>`` whenever they change and periodically."""

    node: str
    devices: tuple[DeviceInfo, ...]
    at_ns: int


class UsageSample(BusEvent, frozen=True, kw_only=True, tag="usage"):
    """What one container uses on one GPU, read from its shared-cache file, on ``hami.usage.<node>``."""

    node: str
    pod_uid: str
    namespace: str
    pod: str
    container: str
    device_uuid: str
    used_bytes: int
    limit_bytes: int
    sm_util_percent: int = 0
    core_limit_percent: int = 0
    priority: int = 0
    at_ns: int
    # HAMi-core's optional figures; a publisher that lacks one leaves it None and its metric is not emitted.
    vdevice_index: int | None = None  # the device's ordinal inside the container (the cache file's index)
    context_bytes: int | None = None
    module_bytes: int | None = None
    buffer_bytes: int | None = None
    last_kernel_at_s: int | None = None  # epoch seconds of the latest kernel launch; 0 = none yet


class DeviceSample(BusEvent, frozen=True, kw_only=True, tag="device-usage"):
    """One physical GPU's host-wide figures from NVML, on ``hami.usage.<node>``."""

    node: str
    device_uuid: str
    index: int
    name: str  # the NVML model name, e.g. "Tesla V100-PCIE-32GB"
    memory_used_bytes: int
    utilization_percent: int = 0
    memory_utilization_percent: int = 0
    at_ns: int


class PodEnded(BusEvent, frozen=True, kw_only=True, tag="pod-ended"):
    """A pod is no longer on ``node`` (deleted, finished, or bound elsewhere), on ``hami.usage.<node>``."""

    node: str
    pod_uid: str
    namespace: str = ""
    name: str = ""
    at_ns: int


class NodePods(BusEvent, frozen=True, kw_only=True, tag="node-pods"):
    """Every GPU pod on ``node`` with its placement, as the node agent knows it, on ``hami.usage.<node>``.

    It heals what core NATS may lose: a missed :class:`PodEnded` (the pod is not listed) and placements
    a consumer missed while it was down (they are listed).
    """

    node: str
    pods: tuple[PlacementDecision, ...] = ()
    at_ns: int


class RefusalReason(msgspec.Struct, frozen=True, kw_only=True):
    """One reason the Filter gave, and on how many nodes (HAMi's ``FilteringFailed`` event, counted)."""

    reason: str  # e.g. "CardInsufficientMemory" or "NodeUnregistered"
    nodes: int


class FilterRefusal(BusEvent, frozen=True, kw_only=True, tag="unplaced"):
    """The extender found no node for a pod, published on ``hami.scheduling.<namespace>``: why a pending pod
    waits, for the metrics service's web page, without it reading Kubernetes events."""

    pod_uid: str
    namespace: str
    name: str
    nodes: int  # the nodes kube-scheduler offered
    reasons: tuple[RefusalReason, ...] = ()  # most frequent first
    at_ns: int


# Everything only node agents publish on hami.usage.<node>; consumers of that subject decode this union.
UsageMessage: TypeAlias = UsageSample | DeviceSample | PodEnded | NodePods

# What the webhook publishes on hami.admission.<namespace>; consumers of that subject decode this union.
AdmissionMessage: TypeAlias = AdmissionEvent | QuotaUsage
