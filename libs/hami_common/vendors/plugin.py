"""The node side of a vendor's device plugin, for declared (fake) devices: what the node agent registers and
what the allocator answers kubelet's ``Allocate`` with (hami-vendors §1.2/§1.7, §2.2/§2.6, §3.2/§3.5).

In production HAMi relies on each vendor's own device plugin for Ascend (Project-HAMi/ascend-device-plugin),
Cambricon (Cambricon/cambricon-k8s-device-plugin, dynamic-smlu mode) and Hygon
(Project-HAMi/dcu-vgpu-device-plugin); our node agent with NVML never writes their annotations, because NVML
only finds NVIDIA GPUs. With ``--inventory fake`` a GPU entry may declare another ``vendor``; then the node
agent and the allocator play that plugin's node side, wire-compatible with it, so a CPU-only machine (the
local stack, CI) runs a mixed cluster end to end.

A family package offers this with a module (named in its registration, :class:`~.registry.FamilySource`)
holding ``FAKE_VENDOR`` (its fake-inventory word, the device-config section that enables it, a chart-default
model) and ``plugin(family)`` (a :class:`VendorPlugin` for that family, or None when the family is not its
own). Services reach them only through :func:`plugins` and :func:`fake_vendors`, never by name; MetaX would
add ``vendors/metax/plugin.py`` and name it in its :class:`~.registry.FamilySource`.
Everything here is pure: pods, devices and a time in, annotations and an answer out.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import ModuleType
from typing import Protocol

from hami_common.allocation import ContainerResponse
from hami_common.annotations import BIND_PHASE, BIND_PHASE_ALLOCATING, BIND_TIME, VGPU_NODE, DeviceInfo
from hami_common.annotations.devices import ContainerDevices, decode_pod_devices, encode_pod_devices
from hami_common.errors import AnnotationError, InvalidInput, NotFound
from hami_common.inventory import Gpu
from hami_common.resources import ContainerResources
from hami_common.vendors._family import DeviceFamily
from hami_common.vendors.registry import plugin_modules

__all__ = [
    "AllocateCall",
    "Entry",
    "FakeVendor",
    "HostFile",
    "PendingView",
    "PluginAnswer",
    "Registration",
    "VendorPlugin",
    "binding_pods",
    "fake_vendors",
    "next_entry",
    "plugins",
]

PENDING = "Pending"


@dataclass(frozen=True, slots=True)
class FakeVendor:
    """How a vendor appears in a fake inventory and in the device config that enables it."""

    vendor: str  # the fake inventory's ``vendor:`` word, e.g. "ascend"
    section: str  # the device-config section that enables the family
    enable: Mapping[str, object]  # that section's value (HAMi's chart defaults, switched on)
    model: str  # a chart-default model for a declared device
    memory_mib: int


@dataclass(frozen=True, slots=True)
class Registration:
    """What the plugin keeps on the Node, and its devices as the metrics service sees them."""

    annotations: Mapping[str, str]  # written when they change (the register value, Ascend's hami-vnpu-core)
    devices: tuple[DeviceInfo, ...]  # published in NodeInventory; ``type`` is the family's device type


@dataclass(frozen=True, slots=True)
class PendingView:
    """A pod bound to the node, as a plugin reads it when looking for the one kubelet is admitting."""

    uid: str
    namespace: str
    name: str
    phase: str
    annotations: Mapping[str, str]
    containers: tuple[ContainerResources, ...]  # init containers first
    deleting: bool = False


@dataclass(frozen=True, slots=True)
class AllocateCall:
    """One container request of kubelet's ``Allocate`` on the socket of ``resource``."""

    node: str
    resource: str
    device_ids: tuple[str, ...]
    pods: Sequence[PendingView]
    gpus: Sequence[Gpu]  # this plugin's declared devices on the node
    # resources already answered per pod uid by this plugin process (Cambricon acts on its second call)
    served: Mapping[str, frozenset[str]] = field(default_factory=dict)
    hook_path: str = "/usr/local"


@dataclass(frozen=True, slots=True)
class HostFile:
    path: str  # absolute host path, written before the answer is returned
    text: str


@dataclass(frozen=True, slots=True)
class PluginAnswer:
    pod: PendingView
    container: str
    response: ContainerResponse
    pod_changes: Mapping[str, str]  # written on the pod once answered (the erased entry, the plugin's flags)
    files: tuple[HostFile, ...] = ()
    # HAMi's PodAllocationTrySuccess (ascend-dp, dcu-dp): once no device entry of any vendor is left, set
    # bind-phase success and release hami.io/mutex.lock. Cambricon's plugin never touches bind-phase.
    settles_bind: bool = True
    release_node_annotation: str | None = None  # deleted from the Node once answered (Cambricon's own lock)


class VendorPlugin(Protocol):
    @property
    def family(self) -> DeviceFamily: ...

    @property
    def to_allocate_key(self) -> str | None:
        """The pod annotation whose entries the plugin erases (None: Cambricon's reads no device list)."""
        ...

    def owns(self, gpu: Gpu) -> bool:
        """Whether a declared device is one of this family's (vendor word and model)."""
        ...

    def register(self, node: str, gpus: Sequence[Gpu]) -> Registration: ...

    def handshake(self, now: datetime) -> Mapping[str, str]:
        """The plugin's ``Reported…`` value on its handshake key, written with every report; {} for none."""
        ...

    def advertised(self, node: str, gpus: Sequence[Gpu]) -> Mapping[str, tuple[str, ...]]:
        """The kubelet resources the plugin serves, each with its device IDs (their count is the node's
        capacity of that resource)."""
        ...

    def socket_name(self, resource: str) -> str: ...

    def allocate(self, call: AllocateCall) -> PluginAnswer:
        """The answer for one container; NotFound when no pod waits for it, InvalidInput when one is wrong."""
        ...


def _modules() -> tuple[ModuleType, ...]:
    """The plugin modules the registered families name (:class:`~.registry.FamilySource`)."""
    return tuple(importlib.import_module(name) for name in plugin_modules())


def plugins(families: Sequence[DeviceFamily]) -> tuple[VendorPlugin, ...]:
    """The node-side plugin of each configured family that has one, in the families' order."""
    modules = _modules()
    found: list[VendorPlugin] = []
    for family in families:
        for module in modules:
            made = module.plugin(family)
            if made is not None:
                found.append(made)
                break
    return tuple(found)


def fake_vendors() -> dict[str, FakeVendor]:
    """Every vendor a fake inventory may declare besides NVIDIA, by its word."""
    return {m.FAKE_VENDOR.vendor: m.FAKE_VENDOR for m in _modules()}


def _bind_time(pod: PendingView) -> int:
    try:
        return int(pod.annotations.get(BIND_TIME, ""))
    except ValueError:
        return 0


def binding_pods(pods: Sequence[PendingView], node: str) -> list[PendingView]:
    """HAMi's ``GetPendingPod`` candidates, oldest bind first: Pending, bound here, bind-phase allocating."""
    found = [
        p
        for p in pods
        if p.phase == PENDING
        and not p.deleting
        and BIND_TIME in p.annotations
        and p.annotations.get(BIND_PHASE) == BIND_PHASE_ALLOCATING
        and p.annotations.get(VGPU_NODE) == node
    ]
    return sorted(found, key=_bind_time)


@dataclass(frozen=True, slots=True)
class Entry:
    """The next container entry of a pod's to-allocate list, and the list with it erased."""

    pod: PendingView
    container: str
    devices: ContainerDevices
    rest: str  # the annotation value once the entry is erased


def next_entry(call: AllocateCall, key: str) -> Entry:
    """The oldest binding pod's first non-empty entry of ``key``; its device count must equal kubelet's.

    NotFound when no binding pod has an entry left (HAMi's ``no binding pod found``); InvalidInput for a
    malformed list or a count kubelet did not ask for (the plugins' ``device number not matched``).
    """
    for pod in binding_pods(call.pods, call.node):
        value = pod.annotations.get(key)
        if not value:
            continue
        try:
            entries = decode_pod_devices(value, key)
        except AnnotationError as err:
            raise InvalidInput(f"pod {pod.namespace}/{pod.name}: {err}") from err
        index = next((i for i, devices in enumerate(entries) if devices), None)
        if index is None:
            continue
        devices = entries[index]
        if len(devices) != len(call.device_ids):
            raise InvalidInput(
                f"pod {pod.namespace}/{pod.name}: device number not matched "
                f"({len(devices)} granted, kubelet asks {len(call.device_ids)})"
            )
        container = pod.containers[index].name if index < len(pod.containers) else ""
        rest = encode_pod_devices((*entries[:index], (), *entries[index + 1 :]))
        return Entry(pod=pod, container=container, devices=devices, rest=rest)
    raise NotFound(f"no binding pod found on node {call.node} for {call.resource}")
