"""Every metric family the aggregator exposes: name, type, help and label names, spelt once.

HAMi's names and labels follow hami-protocol §6 (scheduler §6.1, vGPU monitor §6.2); every HAMi family
carries the constant label ``zone="vGPU"`` except ``hami_build_info``. With ``--legacy-metrics`` each
HAMi family is emitted a second time under its legacy name, with the legacy label names.

One deliberate difference: ``hami_gpu_shared_count`` is typed ``untyped`` rather than ``gauge``.
Prometheus lint (``promtool check metrics``) reserves the ``_count`` suffix for histograms and summaries;
queries, recording rules and dashboards see the same name, labels and values.

The aggregator's own families (``hami_scheduling_*``, ``hami_bus_*``, ``hami_aggregator_*``) extend
HAMi: the scheduling path as the bus sees it, and the aggregator's health.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

__all__ = ["ZONE", "FamilySpec", "Kind"]

ZONE: Final = (("zone", "vGPU"),)


class Kind(enum.StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"
    UNTYPED = "untyped"


@dataclass(frozen=True, slots=True)
class FamilySpec:
    name: str
    help: str
    kind: Kind
    labels: tuple[str, ...]
    const_labels: tuple[tuple[str, str], ...] = ZONE
    legacy_name: str = ""
    legacy_labels: tuple[str, ...] = ()

    def legacy(self) -> FamilySpec | None:
        """The same family under its legacy name and label names, or None when HAMi has no legacy name."""
        if not self.legacy_name:
            return None
        return FamilySpec(
            name=self.legacy_name,
            help=self.help,
            kind=self.kind,
            labels=self.legacy_labels or self.labels,
            const_labels=self.const_labels,
        )


_DEVICE: Final = ("node", "device_uuid", "device_index", "device_type")
_DEVICE_CORES: Final = ("node", "device_uuid", "device_index", "device_cores", "device_type")
_OVERVIEW: Final = ("node", "device_uuid", "device_index", "device_cores", "device_memory_limit", "device_type")
_LEGACY_DEVICE: Final = ("nodeid", "deviceuuid", "deviceidx", "devicetype")
_LEGACY_DEVICE_CORES: Final = ("nodeid", "deviceuuid", "deviceidx", "devicecores", "devicetype")
_LEGACY_OVERVIEW: Final = ("nodeid", "deviceuuid", "deviceidx", "devicecores", "devicememorylimit", "devicetype")
_POD_DEVICE: Final = ("namespace", "node", "pod", "container_index", "device_uuid")
_LEGACY_POD_DEVICE: Final = ("podnamespace", "nodename", "podname", "containeridx", "deviceuuid")
_HOST: Final = ("node", "device_index", "device_uuid", "device_type")
_LEGACY_HOST: Final = ("nodeid", "deviceidx", "deviceuuid", "devicetype")
_CONTAINER: Final = ("namespace", "pod", "container", "vdevice_index", "device_uuid")
_LEGACY_CONTAINER: Final = ("podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid")
_MIG_IDS: Final = ("mig_uuid", "profile", "gpu_instance_id", "compute_instance_id")
_MIG_NODE: Final = ("node", "device_uuid", "device_index", *_MIG_IDS, "placement_start", "placement_size")
_LEGACY_MIG_NODE: Final = (
    "nodeid", "deviceuuid", "deviceidx", "mig_uuid", "migname", "gpu_instance_id", "compute_instance_id",
    "placement_start", "placement_size",
)  # fmt: skip
_MIG_CONTAINER: Final = (*_CONTAINER, *_MIG_IDS)
_LEGACY_MIG_CONTAINER: Final = (*_LEGACY_CONTAINER, "mig_uuid", "migname", "gpu_instance_id", "compute_instance_id")

# --- HAMi scheduler (hami-protocol §6.1) ------------------------------------------------------------------
BUILD_INFO: Final = FamilySpec(
    name="hami_build_info",
    help="A metric with a constant '1' value labeled by version, revision, build_date, go_version, compiler, platform",
    kind=Kind.GAUGE,
    labels=("version", "revision", "build_date", "go_version", "compiler", "platform"),
    const_labels=(),
)
GPU_MEMORY_LIMIT: Final = FamilySpec(
    "hami_gpu_memory_limit_bytes", "Device memory limit for a certain GPU", Kind.GAUGE, _DEVICE,
    legacy_name="GPUDeviceMemoryLimit", legacy_labels=_LEGACY_DEVICE,
)  # fmt: skip
GPU_CORE_LIMIT: Final = FamilySpec(
    "hami_gpu_core_limit_ratio", "Device core limit for a certain GPU", Kind.GAUGE, _DEVICE,
    legacy_name="GPUDeviceCoreLimit", legacy_labels=_LEGACY_DEVICE,
)  # fmt: skip
GPU_MEMORY_ALLOCATED: Final = FamilySpec(
    "hami_gpu_memory_allocated_bytes", "Device memory allocated for a certain GPU", Kind.GAUGE, _DEVICE_CORES,
    legacy_name="GPUDeviceMemoryAllocated", legacy_labels=_LEGACY_DEVICE_CORES,
)  # fmt: skip
GPU_SHARED_COUNT: Final = FamilySpec(
    "hami_gpu_shared_count", "Number of containers sharing this GPU", Kind.UNTYPED, _DEVICE,
    legacy_name="GPUDeviceSharedNum", legacy_labels=_LEGACY_DEVICE,
)  # fmt: skip
GPU_CORE_ALLOCATED: Final = FamilySpec(
    "hami_gpu_core_allocated_ratio", "Device core allocated for a certain GPU", Kind.GAUGE, _DEVICE,
    legacy_name="GPUDeviceCoreAllocated", legacy_labels=_LEGACY_DEVICE,
)  # fmt: skip
NODE_GPU_OVERVIEW: Final = FamilySpec(
    "hami_node_gpu_overview", "GPU overview on a certain node", Kind.GAUGE, _OVERVIEW,
    legacy_name="nodeGPUOverview", legacy_labels=_LEGACY_OVERVIEW,
)  # fmt: skip
NODE_GPU_MEMORY_RATIO: Final = FamilySpec(
    "hami_node_gpu_memory_allocated_ratio", "GPU Memory Allocated Percentage on a certain GPU", Kind.GAUGE, _DEVICE,
    legacy_name="nodeGPUMemoryPercentage", legacy_labels=_LEGACY_DEVICE,
)  # fmt: skip
VGPU_MEMORY_ALLOCATED: Final = FamilySpec(
    "hami_vgpu_memory_allocated_bytes", "vGPU memory allocated from a container", Kind.GAUGE, _POD_DEVICE,
    legacy_name="vGPUMemoryAllocated", legacy_labels=_LEGACY_POD_DEVICE,
)  # fmt: skip
VGPU_CORE_ALLOCATED: Final = FamilySpec(
    "hami_vgpu_core_allocated_ratio", "vGPU core allocated from a container", Kind.GAUGE, _POD_DEVICE,
    legacy_name="vGPUCoreAllocated", legacy_labels=_LEGACY_POD_DEVICE,
)  # fmt: skip

# HAMi gives no label list for its legacy MIG twins beyond the shared vocabulary (nodeid, deviceuuid,
# deviceidx, migname): those are used where they apply and the rest keep their current names.
NODE_GPU_MIG_INSTANCE: Final = FamilySpec(
    "hami_node_gpu_mig_instance_info", "MIG instance on a certain GPU (runtime-ready reservations only)",
    Kind.GAUGE, _MIG_NODE, legacy_name="nodeGPUMigInstance", legacy_labels=_LEGACY_MIG_NODE,
)  # fmt: skip

# --- HAMi vGPU monitor (hami-protocol §6.2) ---------------------------------------------------------------
HOST_MEMORY_USED: Final = FamilySpec(
    "hami_host_gpu_memory_used_bytes", "GPU device memory usage in bytes", Kind.GAUGE, _HOST,
    legacy_name="HostGPUMemoryUsage", legacy_labels=_LEGACY_HOST,
)  # fmt: skip
HOST_UTILIZATION: Final = FamilySpec(
    "hami_host_gpu_utilization_ratio", "GPU core utilization ratio (0-100)", Kind.GAUGE, _HOST,
    legacy_name="HostCoreUtilization", legacy_labels=_LEGACY_HOST,
)  # fmt: skip
HOST_MEMORY_CONTROLLER: Final = FamilySpec(
    "hami_host_gpu_memory_controller_utilization_ratio", "GPU memory controller utilization ratio (0-100)",
    Kind.GAUGE, ("device_index", "device_uuid", "device_type"),
)  # fmt: skip
VGPU_MEMORY_USED: Final = FamilySpec(
    "hami_vgpu_memory_used_bytes", "vGPU device memory usage in bytes", Kind.GAUGE, _CONTAINER,
    legacy_name="vGPU_device_memory_usage_in_bytes", legacy_labels=_LEGACY_CONTAINER,
)  # fmt: skip
VGPU_MEMORY_LIMIT: Final = FamilySpec(
    "hami_vgpu_memory_limit_bytes", "vGPU device memory limit in bytes", Kind.GAUGE, _CONTAINER,
    legacy_name="vGPU_device_memory_limit_in_bytes", legacy_labels=_LEGACY_CONTAINER,
)  # fmt: skip
MIG_DEVICE: Final = FamilySpec(
    "hami_mig_device_info", "MIG device assigned to a container", Kind.GAUGE, _MIG_CONTAINER,
    legacy_name="MigInfo", legacy_labels=_LEGACY_MIG_CONTAINER,
)  # fmt: skip
CONTAINER_MEMORY: Final = FamilySpec(
    "hami_container_device_memory_bytes", "Container device memory usage in bytes", Kind.GAUGE, _CONTAINER,
)  # fmt: skip
# HAMi's legacy memory family carries the breakdown as labels (value: total used).
LEGACY_CONTAINER_MEMORY_DESC: Final = FamilySpec(
    "Device_memory_desc_of_container", "Container device memory description", Kind.GAUGE,
    (*_LEGACY_CONTAINER, "context", "module", "data", "offset"),
)  # fmt: skip
CONTAINER_UTILIZATION: Final = FamilySpec(
    "hami_container_device_utilization_ratio", "Container device SM utilization ratio", Kind.GAUGE, _CONTAINER,
    legacy_name="Device_utilization_desc_of_container", legacy_labels=_LEGACY_CONTAINER,
)  # fmt: skip
CONTAINER_LAST_KERNEL: Final = FamilySpec(
    "hami_container_last_kernel_elapsed_seconds", "Seconds since last kernel execution in container", Kind.GAUGE,
    _CONTAINER, legacy_name="Device_last_kernel_of_container", legacy_labels=_LEGACY_CONTAINER,
)  # fmt: skip
VGPU_MEMORY_CONTEXT: Final = FamilySpec(
    "hami_vgpu_memory_context_bytes", "Container device memory context size in bytes", Kind.GAUGE, _CONTAINER,
)  # fmt: skip
VGPU_MEMORY_MODULE: Final = FamilySpec(
    "hami_vgpu_memory_module_bytes", "Container device memory module size in bytes", Kind.GAUGE, _CONTAINER,
)  # fmt: skip
VGPU_MEMORY_BUFFER: Final = FamilySpec(
    "hami_vgpu_memory_buffer_bytes", "Container device memory buffer size in bytes", Kind.GAUGE, _CONTAINER,
)  # fmt: skip

# HAMi's quota families (hami-protocol §6.1): quota_name is the resource (limits.<name> of a ResourceQuota),
# values in its own unit (MiB, core percent). Only QuotaUsed has a legacy twin.
QUOTA_USED: Final = FamilySpec(
    "hami_resource_quota_used", "resourcequota usage for a certain device", Kind.GAUGE,
    ("namespace", "quota_name", "limit"),
    legacy_name="QuotaUsed", legacy_labels=("quotanamespace", "quotaName", "limit"),
)  # fmt: skip
QUOTA_LIMIT: Final = FamilySpec(
    "hami_resource_quota_limit", "resourcequota limit for a certain device", Kind.GAUGE, ("namespace", "quota_name"),
)  # fmt: skip

# --- beyond HAMi: the scheduling path and the aggregator itself -----------------------------------------
ADMISSIONS: Final = FamilySpec(
    "hami_scheduling_admissions_total",
    "Webhook verdicts on pods, by namespace and result (mutated, allowed, denied); namespace _other: beyond the "
    "cap of labelled namespaces, or quiet for --admission-namespace-staleness-s",
    Kind.COUNTER, ("namespace", "result"), const_labels=(),
)  # fmt: skip
PLACEMENTS: Final = FamilySpec(
    "hami_scheduling_placements_total", "Pods bound to a node and GPUs by the extender", Kind.COUNTER, (),
    const_labels=(),
)  # fmt: skip
ALLOCATIONS: Final = FamilySpec(
    "hami_scheduling_allocations_total",
    "Container Allocate calls answered by the device plugin, by path (staged or fallback) and result",
    Kind.COUNTER, ("path", "result"), const_labels=(),
)  # fmt: skip
ADMISSION_TO_BIND: Final = FamilySpec(
    "hami_scheduling_admission_to_bind_seconds",
    "From the webhook admitting a GPU pod to the extender binding it (filter, queueing and bind)",
    Kind.HISTOGRAM, (), const_labels=(),
)  # fmt: skip
BIND_TO_ALLOCATE: Final = FamilySpec(
    "hami_scheduling_bind_to_allocate_seconds",
    "From bind to the device plugin's Allocate answer for each container: how long the node hand-off is held",
    Kind.HISTOGRAM, ("path",), const_labels=(),
)  # fmt: skip
FILTER: Final = FamilySpec(
    "hami_scheduling_filter_seconds", "The extender's /filter call that chose the pod's node (when reported)",
    Kind.HISTOGRAM, (), const_labels=(),
)  # fmt: skip
BIND: Final = FamilySpec(
    "hami_scheduling_bind_seconds", "The extender's /bind call, from request to published placement (when reported)",
    Kind.HISTOGRAM, (), const_labels=(),
)  # fmt: skip
HANDOFF_WAIT: Final = FamilySpec(
    "hami_scheduling_handoff_wait_seconds",
    "Time a bind waited for the node hand-off, i.e. the previous pod's Allocate on that node (when reported)",
    Kind.HISTOGRAM, (), const_labels=(),
)  # fmt: skip
ALLOCATE: Final = FamilySpec(
    "hami_scheduling_allocate_seconds", "The device plugin's Allocate call, by path (when reported)",
    Kind.HISTOGRAM, ("path",), const_labels=(),
)  # fmt: skip
BUS_DELIVERY_LAG: Final = FamilySpec(
    "hami_bus_delivery_lag_seconds",
    "From an event's timestamp at its publisher to its arrival at the aggregator, by subject kind",
    Kind.HISTOGRAM, ("kind",), const_labels=(),
)  # fmt: skip
BUS_MESSAGES: Final = FamilySpec(
    "hami_bus_messages_total",
    "Bus messages received by the aggregator, by outcome (received, handled, malformed, rejected, failed, ...)",
    Kind.COUNTER, ("outcome",), const_labels=(),
)  # fmt: skip
BUS_CONNECTED: Final = FamilySpec(
    "hami_bus_connected", "1 while the aggregator is connected to NATS", Kind.GAUGE, (), const_labels=(),
)  # fmt: skip
NODES: Final = FamilySpec(
    "hami_aggregator_nodes", "Nodes whose series this aggregator currently exposes", Kind.GAUGE, (), const_labels=(),
)  # fmt: skip
NODES_EXPIRED: Final = FamilySpec(
    "hami_aggregator_nodes_expired_total", "Nodes dropped after reporting nothing for the staleness period",
    Kind.COUNTER, (), const_labels=(),
)  # fmt: skip
EVENTS_APPLIED: Final = FamilySpec(
    "hami_aggregator_events_applied_total", "Bus events folded into the aggregator's state", Kind.COUNTER, (),
    const_labels=(),
)  # fmt: skip
SHARD: Final = FamilySpec(
    "hami_aggregator_shard_info", "The node-hash shard this aggregator serves (1)", Kind.GAUGE, ("index", "count"),
    const_labels=(),
)  # fmt: skip
