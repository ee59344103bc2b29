"""What the aggregator reads from the bus beyond ``hami_common.events``: proposals for the shared module.

Three message shapes are needed to render every HAMi vGPU-monitor family (hami-protocol §6.2) and to
see a pod's end; until they move into ``hami_common.events`` they are defined here, and a publisher
(the node agent) can send them with the same field names and tags:

* :class:`UsageReport` is the aggregator's view of the ``usage`` message: a :class:`UsageSample` with the
  optional fields of HAMi's monitor that the sample lacks (memory breakdown, last kernel time, the
  container's device ordinal). It decodes every plain ``UsageSample``; a field the publisher leaves out
  stays ``None`` and its family is simply not emitted for that container.
* :class:`DeviceSample` is one GPU's host-wide NVML figures (``hami_host_gpu_*``).
* :class:`PodEnded` says a pod left a node: deleted, finished, or bound elsewhere. It removes the pod's
  series at once instead of after the staleness period.
* :class:`NodePods` is the node agent's periodic roster of the GPU pods on its node, with their placements
  (for example with every inventory). It heals what core NATS may lose: a missed ``PodEnded`` (the pod is
  not listed) and the placements an aggregator missed while it was down (they are listed).

The four above travel on ``hami.usage.<node>`` (only node agents publish there), so consumers of that subject
decode :data:`UsageMessage`, a tagged union.

Two more readers add optional timings to existing messages (same tags, so every current message decodes):
:class:`PlacementReport` (the extender's filter and bind times and how long the bind waited for the node
hand-off) and :class:`AllocationReport` (how long the plugin took to answer Allocate).
"""

from __future__ import annotations

from typing import TypeAlias

from hami_common.events import AllocationResult, BusEvent, PlacementDecision, UsageSample

__all__ = [
    "AllocationReport",
    "DeviceSample",
    "NodePods",
    "PlacementReport",
    "PodEnded",
    "UsageMessage",
    "UsageReport",
]


class UsageReport(UsageSample, frozen=True, kw_only=True):
    """A ``usage`` message (same tag as :class:`UsageSample`) with HAMi-core's optional figures."""

    vdevice_index: int | None = None  # the device's ordinal inside the container (the cache file's index)
    context_bytes: int | None = None
    module_bytes: int | None = None
    buffer_bytes: int | None = None
    last_kernel_at_s: int | None = None  # epoch seconds of the container's latest kernel launch; 0 = none yet


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
    """A pod is no longer on ``node`` (deleted, finished, or re-bound elsewhere), on ``hami.usage.<node>``."""

    node: str
    pod_uid: str
    namespace: str = ""
    name: str = ""
    at_ns: int


class NodePods(BusEvent, frozen=True, kw_only=True, tag="node-pods"):
    """Every GPU pod on ``node`` with its placement, as the node agent knows it, on ``hami.usage.<node>``."""

    node: str
    pods: tuple[PlacementDecision, ...] = ()
    at_ns: int


UsageMessage: TypeAlias = UsageReport | DeviceSample | PodEnded | NodePods


class PlacementReport(PlacementDecision, frozen=True, kw_only=True):
    """A ``placement`` message with the extender's timings for this pod, when it sends them."""

    filter_ns: int | None = None  # the /filter call that chose the node
    bind_ns: int | None = None  # the /bind call, from request to published decision
    handoff_wait_ns: int | None = None  # of which waiting for the node hand-off (the previous pod's Allocate)


class AllocationReport(AllocationResult, frozen=True, kw_only=True):
    """An ``allocated`` message with the plugin's own Allocate duration, when it sends it."""

    allocate_ns: int | None = None
