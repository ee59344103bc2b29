"""cambricon-k8s-device-plugin's node side (dynamic-smlu mode) for declared MLUs (hami-vendors §2.2, §2.6).

No annotation and no handshake: the plugin serves, per MLU, 100 devices of ``…smlu.vcore`` and one device of
``…smlu.vmemory`` per 256 MiB, and HAMi invents the cards from that node capacity. Allocate (one call per
resource) finds the Pending pod bound here whose ``CAMBRICON_DSMLU_ASSIGHED`` is ``"false"`` and which limits
this resource, carves the sMLU that ``CAMBRICON_DSMLU_PROFILE`` (``<slot>_<vcore>_<vmemory units>``) names
and answers with its device nodes. Once every sMLU resource of the container is answered it sets both
spellings of the assigned flag to ``"true"``, records ``CAMBRICON_DSMLU_PROFILE_INSTANCE`` and removes
``cambricon.com/dsmlu.lock``. It never reads the device list and never sets ``hami.io/bind-phase``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from hami_common.allocation import ContainerResponse, DeviceSpec
from hami_common.annotations import BIND_TIME, VGPU_NODE, DeviceInfo
from hami_common.errors import InvalidInput, NotFound
from hami_common.inventory import Gpu
from hami_common.quantity import as_int
from hami_common.vendors._family import DeviceFamily, NodeView
from hami_common.vendors.cambricon.config import SECTION
from hami_common.vendors.cambricon.family import SLOTS_PER_MLU, CambriconFamily, devices_from_capacity
from hami_common.vendors.cambricon.keys import (
    DSMLU_ASSIGHED,
    DSMLU_ASSIGNED,
    DSMLU_PROFILE,
    DSMLU_PROFILE_INSTANCE,
    MEMORY_UNIT,
    NODE_LOCK,
    NOT_ASSIGNED,
)
from hami_common.vendors.plugin import PENDING, AllocateCall, FakeVendor, PendingView, PluginAnswer, Registration

__all__ = ["DSMLU_PROFILE_INSTANCE", "FAKE_VENDOR", "CambriconPlugin", "plugin"]

VENDOR: Final = "cambricon"
FAKE_VENDOR: Final = FakeVendor(vendor=VENDOR, section=SECTION, enable={}, model="MLU370", memory_mib=49152)
ASSIGNED: Final = "true"
_CTL: Final = "/dev/cambricon_ctl"


def _bind_time(pod: PendingView) -> int:
    try:
        return int(pod.annotations.get(BIND_TIME, ""))
    except ValueError:
        return 0


def _limit(limits: Mapping[str, str], resource: str) -> int:
    text = limits.get(resource)
    if text is None:
        return 0
    try:
        return as_int(text) or 0
    except InvalidInput:
        return 0


@dataclass(frozen=True, slots=True)
class CambriconPlugin:
    family: CambriconFamily

    @property
    def to_allocate_key(self) -> str | None:
        return None

    @property
    def _smlu(self) -> tuple[str, str]:
        c = self.family.config
        return (c.resource_core_name, c.resource_memory_name)

    def owns(self, gpu: Gpu) -> bool:
        return gpu.vendor == VENDOR

    def capacity(self, gpus: Sequence[Gpu]) -> dict[str, str]:
        cores, memory = self._smlu
        return {cores: str(SLOTS_PER_MLU * len(gpus)), memory: str(sum(g.memory_mib // MEMORY_UNIT for g in gpus))}

    def register(self, node: str, gpus: Sequence[Gpu]) -> Registration:
        """Nothing to write: HAMi reads node capacity. The devices are those it will invent from it."""
        usage = devices_from_capacity(NodeView(name=node, capacity=self.capacity(gpus)), self.family.config)
        healthy = {i: g.healthy for i, g in enumerate(gpus)}
        devices = tuple(
            DeviceInfo(
                id=d.id,
                index=d.index,
                count=d.count,
                devmem=d.totalmem,
                devcore=d.totalcore,
                type=d.type,
                health=healthy.get(d.index, True),
            )
            for d in usage
        )
        return Registration(annotations={}, devices=devices)

    def handshake(self, now: datetime) -> Mapping[str, str]:
        return {}

    def advertised(self, node: str, gpus: Sequence[Gpu]) -> Mapping[str, tuple[str, ...]]:
        cores, memory = self._smlu
        return {
            cores: tuple(f"{g.uuid}-vcore-{i}" for g in gpus for i in range(SLOTS_PER_MLU)),
            memory: tuple(f"{g.uuid}-vmemory-{i}" for g in gpus for i in range(g.memory_mib // MEMORY_UNIT)),
        }

    def socket_name(self, resource: str) -> str:
        return f"cambricon-{resource.rpartition('/')[2]}.sock"

    def allocate(self, call: AllocateCall) -> PluginAnswer:
        candidates = sorted(
            (
                p
                for p in call.pods
                if p.phase == PENDING
                and not p.deleting
                and p.annotations.get(VGPU_NODE) == call.node
                and p.annotations.get(DSMLU_ASSIGHED) == NOT_ASSIGNED
                and any(_limit(c.limits, call.resource) > 0 for c in p.containers)
            ),
            key=_bind_time,
        )
        if not candidates:
            raise NotFound(f"no pending pod with {DSMLU_ASSIGHED}=false asks {call.resource} on node {call.node}")
        pod = candidates[0]
        where = f"pod {pod.namespace}/{pod.name}"
        container = next(c for c in pod.containers if _limit(c.limits, call.resource) > 0)
        profile = pod.annotations.get(DSMLU_PROFILE, "")
        parts = profile.split("_")
        if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts):
            raise InvalidInput(f"{where}: {DSMLU_PROFILE} {profile!r} is not <slot>_<vcore>_<vmemory>")
        slot, vcore, units = (int(p) for p in parts)
        if slot >= len(call.gpus):
            raise InvalidInput(f"{where}: MLU slot {slot} is not on node {call.node}")
        # one instance per pod holding an sMLU on the same slot: the others already assigned come first
        instance = 1 + sum(
            1
            for p in call.pods
            if p.uid != pod.uid
            and p.annotations.get(DSMLU_ASSIGHED) == ASSIGNED
            and p.annotations.get(DSMLU_PROFILE, "").split("_")[0] == str(slot)
        )
        devices = (
            DeviceSpec(container_path=f"/dev/cambricon_dev{slot}", host_path=f"/dev/cambricon_dev{slot}"),
            DeviceSpec(container_path=f"/dev/cambricon_ipcm{slot}", host_path=f"/dev/cambricon_ipcm{slot}"),
            DeviceSpec(
                container_path=f"/dev/cambricon-caps/cap_dev{slot}_mi{instance}",
                host_path=f"/dev/cambricon-caps/cap_dev{slot}_mi{instance}",
            ),
            DeviceSpec(container_path=_CTL, host_path=_CTL),
        )
        wanted = {r for r in self._smlu if _limit(container.limits, r) > 0}
        done = wanted <= (call.served.get(pod.uid, frozenset()) | {call.resource})
        changes: dict[str, str] = {}
        if done:
            changes = {
                DSMLU_ASSIGNED: ASSIGNED,
                DSMLU_ASSIGHED: ASSIGNED,
                DSMLU_PROFILE_INSTANCE: f"{vcore}{units}_{slot}{instance}_{slot}_{instance}",
            }
        return PluginAnswer(
            pod=pod,
            container=container.name,
            response=ContainerResponse(envs={}, devices=devices),
            pod_changes=changes,
            settles_bind=False,
            release_node_annotation=NODE_LOCK if done else None,
        )


def plugin(family: DeviceFamily) -> CambriconPlugin | None:
    return CambriconPlugin(family) if isinstance(family, CambriconFamily) else None
