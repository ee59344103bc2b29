"""Node registration (hami-protocol §2.2, §2.3): what this node's GPUs look like to the scheduler.

:func:`register_devices` is HAMi's device-plugin arithmetic (pure). :class:`Registrar` polls the inventory,
patches ``hami.io/node-nvidia-register`` (and ``hami.io/node-nvidia-score`` when topology scoring is on) only
when a value differs from what was last written, checks the node itself every ``register_interval`` (so an
annotation removed by someone else comes back), and publishes a :class:`NodeInventory` with every change and
every full check. Health is polled every ``health_interval``, so a GPU that fails is registered unhealthy on the
next poll rather than at the next full check.

Declared devices of other families (a fake inventory's ``vendor: ascend`` …) are registered as that family's
device plugin would (:mod:`hami_common.vendors.plugin`): its annotations when they change, its handshake
``Reported…`` with every full check, its devices in the same :class:`NodeInventory`. NVML finds only NVIDIA
GPUs, so in production this agent never writes another vendor's annotations; their own plugins do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Protocol

import msgspec
from opentelemetry.context import Context

from hami_common import logkeys, subjects
from hami_common.annotations import (
    NODE_PLACEMENTS,
    NODE_PLACEMENTS_BUS,
    NODE_REGISTER,
    NODE_SCORE,
    DeviceInfo,
    encode_node_devices,
    encode_pair_scores,
)
from hami_common.errors import HamiError
from hami_common.events import NodeInventory
from hami_common.inventory import (
    MODE_HAMI_CORE,
    MODE_MIG,
    Gpu,
    GpuInventory,
    NodeDeviceConfig,
    instance_count,
    pair_scores,
)
from hami_common.kube import EventRecorder, NodePatcher, ObjectReference
from hami_common.vendors.plugin import VendorPlugin

__all__ = ["ASYMMETRIC_LINK_REASON", "NVIDIA_PREFIX", "Publisher", "Registrar", "register_devices", "visible_gpus"]

log = logging.getLogger(__name__)

NVIDIA_PREFIX: Final = "NVIDIA"
ASYMMETRIC_LINK_REASON: Final = "AsymmetricGPUP2PLink"
_CORE_UNIT: Final = 100


class Publisher(Protocol):
    async def publish(self, subject: str, event: msgspec.Struct, *, ctx: Context | None = None) -> None: ...


def visible_gpus(gpus: Sequence[Gpu], config: NodeDeviceConfig) -> tuple[Gpu, ...]:
    """The GPUs not excluded by ``filterdevices``."""
    return tuple(g for g in gpus if g.uuid not in config.filter_uuids and g.index not in config.filter_indices)


def _type(gpu: Gpu) -> str:
    return gpu.model if gpu.model.startswith(NVIDIA_PREFIX) else f"{NVIDIA_PREFIX}-{gpu.model}"


def _mig_device(gpu: Gpu, config: NodeDeviceConfig) -> DeviceInfo:
    """A GPU in MIG mode on a node in MIG mode: its allowed profiles; ``count`` is the most instances any of them
    fits side by side; memory and cores are the whole card's, never scaled (hami-protocol §2.2)."""
    profiles = config.mig_profiles(gpu)
    return DeviceInfo(
        id=gpu.uuid,
        index=gpu.index,
        count=max((instance_count(p.placements) for p in profiles), default=0),
        devmem=gpu.memory_mib or config.preconfigured_memory_mib,
        devcore=_CORE_UNIT,
        type=_type(gpu),
        numa=max(gpu.numa, 0),
        mode=MODE_MIG,
        mig_profiles=profiles,
        health=gpu.healthy,
    )


def register_devices(gpus: Sequence[Gpu], config: NodeDeviceConfig) -> tuple[DeviceInfo, ...]:
    """One ``DeviceInfo`` per visible GPU, as HAMi's device plugin registers it (register.go:92-207).

    On a node whose ``operatingmode`` is ``mig``, a GPU in MIG mode registers ``mode: mig`` with its profiles; a
    GPU not in MIG mode there, and every GPU elsewhere, registers as a ``hami-core`` GPU shared in slots.
    """
    devices: list[DeviceInfo] = []
    for gpu in visible_gpus(gpus, config):
        if config.mode == MODE_MIG and gpu.mig:
            devices.append(_mig_device(gpu, config))
            continue
        memory = gpu.memory_mib or config.preconfigured_memory_mib
        if config.memory_scaling != 1:
            memory = int(memory * config.memory_scaling)
        devices.append(
            DeviceInfo(
                id=gpu.uuid,
                index=gpu.index,
                count=config.split_count,
                devmem=memory,
                devcore=int(config.core_scaling * _CORE_UNIT),
                type=_type(gpu),
                numa=max(gpu.numa, 0),
                mode=MODE_HAMI_CORE,
                health=gpu.healthy,
            )
        )
    return tuple(devices)


@dataclass(eq=False)
class Registrar:
    node: str
    inventory: GpuInventory
    nodes: NodePatcher
    publisher: Publisher
    config: NodeDeviceConfig = field(default_factory=NodeDeviceConfig)
    topology: bool = False
    events: EventRecorder | None = None
    clock: Callable[[], int] = time.time_ns
    register_interval: float = 30.0
    health_interval: float = 5.0
    plugins: tuple[VendorPlugin, ...] = ()  # the configured families' node sides, for declared devices
    patches: int = 0  # how many times the node was patched: a test or a metric reads it
    scans: int = 0
    _sent: dict[str, str] = field(default_factory=dict)
    _devices: tuple[DeviceInfo, ...] | None = None
    _reported_pairs: set[tuple[str, str]] = field(default_factory=set)

    async def scan(self, *, check_node: bool = False) -> bool:
        """Poll the inventory once; patch what changed; True if the node was patched. Raises HamiError."""
        found = visible_gpus(await asyncio.to_thread(self.inventory.gpus), self.config)
        gpus = tuple(g for g in found if g.is_nvidia)
        devices = register_devices(gpus, self.config)
        # the marker rides on the registration's own patch: the scheduler binds here without HAMi's node lock
        wanted = {NODE_REGISTER: encode_node_devices(devices), NODE_PLACEMENTS: NODE_PLACEMENTS_BUS}
        if self.topology:
            report = pair_scores(gpus)
            wanted[NODE_SCORE] = encode_pair_scores(report.scores)
            await self._warn_asymmetric(report.asymmetric)
        now = datetime.fromtimestamp(self.clock() / 1e9).astimezone()  # the plugins stamp local time
        handshakes: dict[str, str] = {}
        for plugin in self.plugins:
            mine = [g for g in found if plugin.owns(g)]
            if not mine:
                continue  # no device of this family here: its own plugin (or nobody) registers it
            registration = plugin.register(self.node, mine)
            wanted.update(registration.annotations)
            devices += registration.devices
            handshakes.update(plugin.handshake(now))
        if check_node:
            annotations = (await self.nodes.get_node(self.node)).metadata.annotations
            current = {key: annotations.get(key, "") for key in wanted}
        else:
            current = dict(self._sent)
        changes = {key: value for key, value in wanted.items() if current.get(key) != value}
        if handshakes and (changes or check_node):
            changes.update(handshakes)  # each report answers the scheduler's Requesting_… (hami-vendors §0.2)
        if changes:
            await self.nodes.patch_node_annotations(self.node, changes)
            self.patches += 1
            log.info("registered %d GPUs of %s", len(devices), self.node, extra={logkeys.NODE: self.node})
        self._sent = wanted
        self.scans += 1
        if changes or check_node or devices != self._devices:
            self._devices = devices
            event = NodeInventory(node=self.node, devices=devices, at_ns=self.clock())
            await self.publisher.publish(subjects.inventory(self.node), event)
        return bool(changes)

    async def _warn_asymmetric(self, pairs: Sequence[tuple[str, str]]) -> None:
        for a, b in pairs:
            if (a, b) in self._reported_pairs:
                continue
            self._reported_pairs.add((a, b))
            log.warning("GPUs %s and %s see different link counts; their pair scores 0", a, b)
            if self.events is not None:
                ref = ObjectReference(api_version="v1", kind="Node", name=self.node)
                await self.events.record(
                    ref, "Warning", ASYMMETRIC_LINK_REASON, f"GPU {a} and {b} report asymmetric P2P links"
                )

    async def run(self) -> None:
        """Scan every ``health_interval`` and check the node every ``register_interval``, until cancelled.

        A failed scan (inventory unreadable, apiserver down) is logged and retried at the next poll.
        """
        loop = asyncio.get_running_loop()
        next_check = loop.time()
        while True:
            check = loop.time() >= next_check
            try:
                await self.scan(check_node=check)
                if check:
                    next_check = loop.time() + self.register_interval
            except HamiError as err:
                log.warning("registration of %s failed, retrying: %s", self.node, err, extra={logkeys.NODE: self.node})
                next_check = loop.time()  # after an error, check the node itself again
            except Exception:  # the loop's edge: a bug is logged with its traceback, the agent keeps serving
                log.exception("registration of %s failed unexpectedly", self.node)
                next_check = loop.time()
            await asyncio.sleep(self.health_interval)  # the poll period, not a wait for a condition
