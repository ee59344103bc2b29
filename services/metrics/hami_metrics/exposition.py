"""From a :class:`ClusterState` to metric families with HAMi's names, labels and units (hami-protocol §6).

:func:`collect` is pure: the state, the time and the aggregator's own figures in, families out.
:mod:`hami_metrics.textformat` turns families into the Prometheus text format.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from hami_metrics import families as fam
from hami_metrics.families import FamilySpec
from hami_metrics.histogram import Histogram
from hami_metrics.state import NS_PER_S, ClusterState, NodeState

__all__ = ["BuildInfo", "Family", "HistogramFamily", "Scrape", "collect"]

MIB: Final = 1 << 20
MONITOR_TYPE_PREFIX: Final = "NVIDIA-"  # the monitor prefixes NVML's model name unconditionally

Value: TypeAlias = int | float
Series: TypeAlias = tuple[str, ...]  # label values, in the order of the family's label names


@dataclass(slots=True)
class Family:
    """Samples in columns: ``series[i]`` has ``values[i]``.

    Families that cover the same series (a container's used, limit, utilisation, ...) share one ``series``
    list object, so a renderer can escape each series' labels once per scrape rather than once per family.
    """

    spec: FamilySpec
    series: list[Series] = field(default_factory=list)
    values: list[Value] = field(default_factory=list)

    def samples(self) -> list[tuple[Series, Value]]:
        return list(zip(self.series, self.values, strict=True))


@dataclass(slots=True)
class HistogramFamily:
    spec: FamilySpec
    series: list[tuple[Series, Histogram]] = field(default_factory=list)


def _family(spec: FamilySpec, samples: list[tuple[Series, Value]]) -> Family:
    return Family(spec, [s for s, _ in samples], [v for _, v in samples])


AnyFamily: TypeAlias = Family | HistogramFamily


@dataclass(frozen=True, slots=True)
class BuildInfo:
    version: str
    revision: str = ""
    build_date: str = ""
    go_version: str = field(default_factory=lambda: f"python{platform.python_version()}")  # HAMi's label name
    compiler: str = field(default_factory=lambda: sys.implementation.name)
    platform: str = field(default_factory=lambda: f"{sys.platform}/{platform.machine()}")

    def labels(self) -> tuple[str, ...]:
        return (self.version, self.revision, self.build_date, self.go_version, self.compiler, self.platform)


@dataclass(frozen=True, slots=True)
class Scrape:
    """What a scrape shows besides the cluster state."""

    now_ns: int
    build: BuildInfo
    legacy: bool = False
    bus_counts: Mapping[str, int] = field(default_factory=dict)
    bus_connected: bool = False
    shard_index: int = 0
    shard_count: int = 1


def collect(state: ClusterState, scrape: Scrape) -> list[AnyFamily]:
    """Every family, in a fixed order; families without samples are still listed (HELP and TYPE only)."""
    device = _device_families(state)
    container = _container_families(state, scrape.now_ns)
    out: list[AnyFamily] = [_family(fam.BUILD_INFO, [(scrape.build.labels(), 1)])]
    out += device
    out += container
    if scrape.legacy:
        out += _legacy(device + container)
        out.append(_legacy_memory_desc(state))
    out += _path_families(state, scrape)
    return out


def _device_families(state: ClusterState) -> list[Family]:
    base: list[Series] = []
    with_cores: list[Series] = []
    overview: list[Series] = []
    limit: list[Value] = []
    core_limit: list[Value] = []
    allocated: list[Value] = []
    shared: list[Value] = []
    core_allocated: list[Value] = []
    ratio = Family(fam.NODE_GPU_MEMORY_RATIO)
    pod_series: list[Series] = []
    pod_mem: list[Value] = []
    pod_core: list[Value] = []
    for node in state.nodes.values():
        used = _device_usage(node)
        for dev in node.devices:
            mem_mib, cores, slots = used.get(dev.uuid, (0, 0, 0))
            index = str(dev.index)
            labels = (node.name, dev.uuid, index, dev.type)
            base.append(labels)
            with_cores.append((node.name, dev.uuid, index, str(dev.devcore), dev.type))
            overview.append((node.name, dev.uuid, index, str(dev.devcore), str(dev.devmem_mib), dev.type))
            limit.append(dev.devmem_mib * MIB)
            core_limit.append(dev.devcore)
            allocated.append(mem_mib * MIB)
            shared.append(slots)
            core_allocated.append(cores)
            if dev.devmem_mib > 0:
                ratio.series.append(labels)
                ratio.values.append(mem_mib / dev.devmem_mib)
        for pod in node.pods.values():
            for d in pod.devices:
                pod_series.append(d.series)
                pod_mem.append(d.usedmem_mib * MIB)
                pod_core.append(d.usedcores)
    if len(ratio.series) == len(base):
        ratio.series = base
    return [
        Family(fam.GPU_MEMORY_LIMIT, base, limit),
        Family(fam.GPU_CORE_LIMIT, base, core_limit),
        Family(fam.GPU_MEMORY_ALLOCATED, with_cores, allocated),
        Family(fam.GPU_SHARED_COUNT, base, shared),
        Family(fam.GPU_CORE_ALLOCATED, base, core_allocated),
        Family(fam.NODE_GPU_OVERVIEW, overview, allocated),
        ratio,
        Family(fam.VGPU_MEMORY_ALLOCATED, pod_series, pod_mem),
        Family(fam.VGPU_CORE_ALLOCATED, pod_series, pod_core),
    ]


def _device_usage(node: NodeState) -> dict[str, tuple[int, int, int]]:
    """Per GPU uuid: (Usedmem MiB, Usedcores, Used slots) summed over the pods placed on the node."""
    used: dict[str, tuple[int, int, int]] = {}
    for pod in node.pods.values():
        for d in pod.devices:
            mem, cores, slots = used.get(d.uuid, (0, 0, 0))
            used[d.uuid] = (mem + d.usedmem_mib, cores + d.usedcores, slots + d.slots)
    return used


def _optional(spec: FamilySpec, all_series: list[Series], samples: list[tuple[Series, Value]]) -> Family:
    """A family only some containers have; it shares the full series list when every container has it."""
    family = _family(spec, samples)
    if len(samples) == len(all_series):
        family.series = all_series
    return family


def _container_families(state: ClusterState, now_ns: int) -> list[Family]:
    host_series: list[Series] = []
    host_mc_series: list[Series] = []
    host_mem: list[Value] = []
    host_util: list[Value] = []
    host_mc: list[Value] = []
    series: list[Series] = []
    used: list[Value] = []
    limit: list[Value] = []
    util: list[Value] = []
    context: list[tuple[Series, Value]] = []
    module: list[tuple[Series, Value]] = []
    buffer: list[tuple[Series, Value]] = []
    last_kernel: list[tuple[Series, Value]] = []
    now_s = now_ns // NS_PER_S
    for node in state.nodes.values():
        for h in node.host.values():
            device_type = MONITOR_TYPE_PREFIX + h.name
            host_series.append((node.name, str(h.index), h.uuid, device_type))
            host_mc_series.append((str(h.index), h.uuid, device_type))
            host_mem.append(h.memory_used_bytes)
            host_util.append(h.utilization_percent)
            host_mc.append(h.memory_utilization_percent)
        for u in node.usage.values():
            labels = u.series
            series.append(labels)
            used.append(u.used_bytes)
            limit.append(u.limit_bytes)
            util.append(u.sm_util_percent)
            if u.context_bytes is not None:
                context.append((labels, u.context_bytes))
            if u.module_bytes is not None:
                module.append((labels, u.module_bytes))
            if u.buffer_bytes is not None:
                buffer.append((labels, u.buffer_bytes))
            if u.last_kernel_at_s:  # HAMi: only when a kernel was ever launched
                last_kernel.append((labels, max(now_s - u.last_kernel_at_s, 0)))
    return [
        Family(fam.HOST_MEMORY_USED, host_series, host_mem),
        Family(fam.HOST_UTILIZATION, host_series, host_util),
        Family(fam.HOST_MEMORY_CONTROLLER, host_mc_series, host_mc),
        Family(fam.VGPU_MEMORY_USED, series, used),
        Family(fam.VGPU_MEMORY_LIMIT, series, limit),
        Family(fam.CONTAINER_MEMORY, series, used),
        Family(fam.CONTAINER_UTILIZATION, series, util),
        _optional(fam.CONTAINER_LAST_KERNEL, series, last_kernel),
        _optional(fam.VGPU_MEMORY_CONTEXT, series, context),
        _optional(fam.VGPU_MEMORY_MODULE, series, module),
        _optional(fam.VGPU_MEMORY_BUFFER, series, buffer),
    ]


def _legacy(current: list[Family]) -> list[Family]:
    """HAMi's legacy names: the same samples, the legacy label names in the same positions."""
    out = []
    for family in current:
        spec = family.spec.legacy()
        if spec is not None:
            out.append(Family(spec, family.series, family.values))
    return out


def _legacy_memory_desc(state: ClusterState) -> Family:
    desc = Family(fam.LEGACY_CONTAINER_MEMORY_DESC)
    for node in state.nodes.values():
        for u in node.usage.values():
            context, module, buffer = u.context_bytes or 0, u.module_bytes or 0, u.buffer_bytes or 0
            offset = u.used_bytes - context - module - buffer
            desc.series.append((*u.series, str(context), str(module), str(buffer), str(offset)))
            desc.values.append(u.used_bytes)
    return desc


def _path_families(state: ClusterState, scrape: Scrape) -> list[AnyFamily]:
    path = state.path
    return [
        _family(fam.ADMISSIONS, sorted(path.admissions.items())),
        _family(fam.PLACEMENTS, [((), path.placements)]),
        _family(fam.ALLOCATIONS, sorted(path.allocations.items())),
        HistogramFamily(fam.ADMISSION_TO_BIND, [((), path.admission_to_bind)]),
        HistogramFamily(fam.BIND_TO_ALLOCATE, [((route,), h) for route, h in sorted(path.bind_to_allocate.items())]),
        HistogramFamily(fam.BUS_DELIVERY_LAG, [((kind,), h) for kind, h in sorted(path.delivery_lag.items())]),
        _family(fam.BUS_MESSAGES, [((outcome,), n) for outcome, n in sorted(scrape.bus_counts.items())]),
        _family(fam.BUS_CONNECTED, [((), int(scrape.bus_connected))]),
        _family(fam.NODES, [((), len(state.nodes))]),
        _family(fam.NODES_EXPIRED, [((), state.nodes_expired)]),
        _family(fam.EVENTS_APPLIED, [((), state.applied)]),
        _family(fam.SHARD, [((str(scrape.shard_index), str(scrape.shard_count)), 1)]),
    ]
