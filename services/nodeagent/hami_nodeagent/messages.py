"""Usage-subject messages beyond ``hami_common.events``, with the field names and tags the metrics service reads.

The aggregator's proposal (its ``messages`` module) defines these shapes for ``hami.usage.<node>``; a service
never imports another, so they are spelt again here until they move into ``hami_common.events``. A test
decodes what this module encodes with the aggregator's types, so the two cannot drift unnoticed.

* :class:`UsageReport`: a :class:`UsageSample` (same tag) with HAMi-core's breakdown and last kernel time;
* :class:`DeviceSample`: one GPU's host-wide NVML figures;
* :class:`PodEnded`: a pod left this node, so its series go at once.
"""

from __future__ import annotations

from hami_common.events import BusEvent, UsageSample

__all__ = ["DeviceSample", "PodEnded", "UsageReport"]


class UsageReport(UsageSample, frozen=True, kw_only=True):
    vdevice_index: int | None = None  # the device's ordinal inside the container (the cache file's index)
    context_bytes: int | None = None
    module_bytes: int | None = None
    buffer_bytes: int | None = None
    last_kernel_at_s: int | None = None  # epoch seconds of the latest kernel launch; 0 = none yet


class DeviceSample(BusEvent, frozen=True, kw_only=True, tag="device-usage"):
    node: str
    device_uuid: str
    index: int
    name: str  # the NVML model name
    memory_used_bytes: int
    utilization_percent: int = 0
    memory_utilization_percent: int = 0
    at_ns: int


class PodEnded(BusEvent, frozen=True, kw_only=True, tag="pod-ended"):
    node: str
    pod_uid: str
    namespace: str = ""
    name: str = ""
    at_ns: int
