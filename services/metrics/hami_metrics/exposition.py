"""From a :class:`ClusterState` to metric families with HAMi's names, labels and units (hami-protocol §6).

:func:`collect` is pure: the state, the time and the aggregator's own figures in, families out.
:mod:`hami_metrics.textformat` turns families into the Prometheus text format.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeAlias, TypeVar

from hami_metrics import families as fam
from hami_metrics.families import FamilySpec
from hami_metrics.histogram import Histogram
from hami_metrics.podusage import PodDevice
from hami_metrics.state import NS_PER_S, ClusterState, ContainerUsage, HostDevice, NodeState

__all__ = ["AnyFamily", "BuildInfo", "Cell", "Family", "HistogramFamily", "RowGroup", "Scrape", "collect"]

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


R = TypeVar("R")
Cell: TypeAlias = tuple[Series, Value] | None  # one family's sample of a record, or none


@dataclass(slots=True)
class RowGroup(Generic[R]):
    """Families fed by the same immutable records: ``row(record)`` gives one cell per family in ``specs``.

    A record never changes, so neither does its row: a renderer may keep a record's formatted lines for as
    long as the record is in the state (a container's until its next usage report, a pod's for its life),
    and a scrape then formats only what changed since the last one.
    """

    specs: tuple[FamilySpec, ...]
    records: list[R]
    row: Callable[[R], tuple[Cell, ...]]

    def families(self) -> list[Family]:
        """The same samples as plain families (for encoders without a row cache)."""
        out = [Family(spec) for spec in self.specs]
        for record in self.records:
            for family, cell in zip(out, self.row(record), strict=True):
                if cell is not None:
                    family.series.append(cell[0])
                    family.values.append(cell[1])
        return out


AnyFamily: TypeAlias = Family | HistogramFamily | RowGroup[Any]


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
    legacy = scrape.legacy
    device = _device_families(state)
    out: list[AnyFamily] = [_family(fam.BUILD_INFO, [(scrape.build.labels(), 1)])]
    out += device
    out.append(_pod_group(state, legacy))
    out.append(_host_group(state, legacy))
    out.append(_container_group(state, legacy))
    out.append(_last_kernel(state, fam.CONTAINER_LAST_KERNEL, scrape.now_ns))
    mig = _mig_families(state)
    out += mig
    quota = _quota_families(state)
    out += quota
    if legacy:
        out += _legacy(device)
        out.append(_last_kernel(state, fam.CONTAINER_LAST_KERNEL.legacy() or fam.CONTAINER_LAST_KERNEL, scrape.now_ns))
        out += _legacy(quota)
        out += _legacy(mig)
    out += _path_families(state, scrape)
    return out


def _with_legacy(specs: tuple[FamilySpec, ...], legacy: bool) -> tuple[FamilySpec, ...]:
    """``specs``, then (with legacy names) the legacy twin of each that has one."""
    if not legacy:
        return specs
    return specs + tuple(twin for twin in (spec.legacy() for spec in specs) if twin is not None)


def _cells(specs: tuple[FamilySpec, ...], cells: tuple[Cell, ...], legacy: bool) -> tuple[Cell, ...]:
    """The cells of ``specs``, then (with legacy names) the same cells again for the legacy twins."""
    if not legacy:
        return cells
    return cells + tuple(cell for spec, cell in zip(specs, cells, strict=True) if spec.legacy_name)


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
    ]


def _device_usage(node: NodeState) -> dict[str, tuple[int, int, int]]:
    """Per GPU uuid: (Usedmem MiB, Usedcores, Used slots) summed over the pods placed on the node."""
    used: dict[str, tuple[int, int, int]] = {}
    for pod in node.pods.values():
        for d in pod.devices:
            mem, cores, slots = used.get(d.uuid, (0, 0, 0))
            used[d.uuid] = (mem + d.usedmem_mib, cores + d.usedcores, slots + d.slots)
    return used


_POD_SPECS: Final = (fam.VGPU_MEMORY_ALLOCATED, fam.VGPU_CORE_ALLOCATED)
_HOST_SPECS: Final = (fam.HOST_MEMORY_USED, fam.HOST_UTILIZATION, fam.HOST_MEMORY_CONTROLLER)
_CONTAINER_SPECS: Final = (
    fam.VGPU_MEMORY_USED,
    fam.VGPU_MEMORY_LIMIT,
    fam.CONTAINER_MEMORY,
    fam.CONTAINER_UTILIZATION,
    fam.VGPU_MEMORY_CONTEXT,
    fam.VGPU_MEMORY_MODULE,
    fam.VGPU_MEMORY_BUFFER,
)


def _pod_group(state: ClusterState, legacy: bool) -> RowGroup[PodDevice]:
    def row(d: PodDevice) -> tuple[Cell, ...]:
        return _cells(_POD_SPECS, ((d.series, d.usedmem_mib * MIB), (d.series, d.usedcores)), legacy)

    records = [d for node in state.nodes.values() for pod in node.pods.values() for d in pod.devices]
    return RowGroup(_with_legacy(_POD_SPECS, legacy), records, row)


def _host_group(state: ClusterState, legacy: bool) -> RowGroup[HostDevice]:
    def row(h: HostDevice) -> tuple[Cell, ...]:
        device_type = MONITOR_TYPE_PREFIX + h.name
        labels = (h.node, str(h.index), h.uuid, device_type)
        cells: tuple[Cell, ...] = (
            (labels, h.memory_used_bytes),
            (labels, h.utilization_percent),
            ((str(h.index), h.uuid, device_type), h.memory_utilization_percent),  # HAMi: no node label
        )
        return _cells(_HOST_SPECS, cells, legacy)

    records = [h for node in state.nodes.values() for h in node.host.values()]
    return RowGroup(_with_legacy(_HOST_SPECS, legacy), records, row)


def _container_group(state: ClusterState, legacy: bool) -> RowGroup[ContainerUsage]:
    specs = _with_legacy(_CONTAINER_SPECS, legacy)
    if legacy:
        specs += (fam.LEGACY_CONTAINER_MEMORY_DESC,)

    def row(u: ContainerUsage) -> tuple[Cell, ...]:
        labels = u.series
        cells: tuple[Cell, ...] = (
            (labels, u.used_bytes),
            (labels, u.limit_bytes),
            (labels, u.used_bytes),
            (labels, u.sm_util_percent),
            None if u.context_bytes is None else (labels, u.context_bytes),
            None if u.module_bytes is None else (labels, u.module_bytes),
            None if u.buffer_bytes is None else (labels, u.buffer_bytes),
        )
        cells = _cells(_CONTAINER_SPECS, cells, legacy)
        if legacy:  # HAMi's legacy memory family carries the breakdown as labels; its value is the total
            context, module, buffer = u.context_bytes or 0, u.module_bytes or 0, u.buffer_bytes or 0
            offset = u.used_bytes - context - module - buffer
            cells += (((*labels, str(context), str(module), str(buffer), str(offset)), u.used_bytes),)
        return cells

    records = [u for node in state.nodes.values() for u in node.usage.values()]
    return RowGroup(specs, records, row)


def _last_kernel(state: ClusterState, spec: FamilySpec, now_ns: int) -> Family:
    """Seconds since the last kernel: changes every second, so it is formatted on every scrape."""
    family = Family(spec)
    now_s = now_ns // NS_PER_S
    for node in state.nodes.values():
        for u in node.usage.values():
            if u.last_kernel_at_s:  # HAMi: only when a kernel was ever launched
                family.series.append(u.series)
                family.values.append(max(now_s - u.last_kernel_at_s, 0))
    return family


def _mig_families(state: ClusterState) -> list[Family]:
    """Each runtime-ready MIG instance once per node (its card, profile and placement) and once per
    container that holds it (HAMi's ``hami_node_gpu_mig_instance_info`` and ``hami_mig_device_info``)."""
    instances: list[tuple[Series, Value]] = []
    devices: list[tuple[Series, Value]] = []
    for node in state.nodes.values():
        index = {dev.uuid: str(dev.index) for dev in node.devices}
        for pod in node.pods.values():
            for m in pod.mig:
                if not m.realised:
                    continue
                ids = (m.mig_uuid or "", m.profile, str(m.gpu_instance_id), str(m.compute_instance_id))
                place = (str(m.placement.start), str(m.placement.size))
                instances.append(((node.name, m.gpu_uuid, index.get(m.gpu_uuid, ""), *ids, *place), 1))
                ctr = pod.containers[m.container_index] if m.container_index < len(pod.containers) else ""
                devices.append(((pod.namespace, pod.name, ctr, str(m.device_index), m.gpu_uuid, *ids), 1))
    return [_family(fam.NODE_GPU_MIG_INSTANCE, instances), _family(fam.MIG_DEVICE, devices)]


def _quota_families(state: ClusterState) -> list[Family]:
    """HAMi's quota families: used for every tracked resource (its limit as a label), the limit where set."""
    used: list[tuple[Series, Value]] = []
    limits: list[tuple[Series, Value]] = []
    for namespace, resources in sorted(state.quotas.items()):
        for r in resources:
            used.append(((namespace, r.name, "" if r.limit is None else str(r.limit)), r.used))
            if r.limit is not None:
                limits.append(((namespace, r.name), r.limit))
    return [_family(fam.QUOTA_USED, used), _family(fam.QUOTA_LIMIT, limits)]


def _legacy(current: list[Family]) -> list[Family]:
    """HAMi's legacy names: the same samples, the legacy label names in the same positions."""
    out = []
    for family in current:
        spec = family.spec.legacy()
        if spec is not None:
            out.append(Family(spec, family.series, family.values))
    return out


def _path_families(state: ClusterState, scrape: Scrape) -> list[AnyFamily]:
    path = state.path
    return [
        _family(fam.ADMISSIONS, sorted(path.admissions.items())),
        _family(fam.PLACEMENTS, [((), path.placements)]),
        _family(fam.ALLOCATIONS, sorted(path.allocations.items())),
        HistogramFamily(fam.ADMISSION_TO_BIND, [((), path.admission_to_bind)]),
        HistogramFamily(fam.BIND_TO_ALLOCATE, [((route,), h) for route, h in sorted(path.bind_to_allocate.items())]),
        HistogramFamily(fam.FILTER, [((), path.filter)]),
        HistogramFamily(fam.BIND, [((), path.bind)]),
        HistogramFamily(fam.HANDOFF_WAIT, [((), path.handoff_wait)]),
        HistogramFamily(fam.ALLOCATE, [((route,), h) for route, h in sorted(path.allocate.items())]),
        HistogramFamily(fam.BUS_DELIVERY_LAG, [((kind,), h) for kind, h in sorted(path.delivery_lag.items())]),
        _family(fam.BUS_MESSAGES, [((outcome,), n) for outcome, n in sorted(scrape.bus_counts.items())]),
        _family(fam.BUS_CONNECTED, [((), int(scrape.bus_connected))]),
        _family(fam.NODES, [((), len(state.nodes))]),
        _family(fam.NODES_EXPIRED, [((), state.nodes_expired)]),
        _family(fam.EVENTS_APPLIED, [((), state.applied)]),
        _family(fam.SHARD, [((str(scrape.shard_index), str(scrape.shard_count)), 1)]),
    ]
