"""dcu-vgpu-device-plugin's node side for declared DCUs (dcu-dp; hami-vendors §3.2, §3.5).

Registration: ``hami.io/node-dcu-register`` in the 9-field colon form (:func:`.register.encode_register`:
count 4, devcore 100, type ``DCU-<model>``, mode ``hami``) and ``Reported <Go time.String()>`` on
``hami.io/node-handshake-dcu`` with every report. kubelet sees 4 devices ``<id>-fake-<i>`` per DCU of
``hygon.com/dcunum``. Allocate answers with :func:`.allocate.allocate_contract` (device nodes and mounts, no
env); a vDCU's ``vdev<N>.conf`` is written first. What a real node would read from dcgm is made up from the
declaration: DRM card ``<index>``/renderD ``128+<index>``, a bus id from the index, 64 compute units.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from hami_common.allocation import ContainerResponse, DeviceSpec, Mount
from hami_common.annotations import DeviceInfo
from hami_common.errors import InvalidInput
from hami_common.inventory import Gpu
from hami_common.vendors._common import FULL_CORES
from hami_common.vendors._family import DeviceFamily
from hami_common.vendors.hygon.allocate import DrmNodes, VdevSlot, allocate_contract, needs_vdcu
from hami_common.vendors.hygon.config import SECTION
from hami_common.vendors.hygon.family import HygonFamily
from hami_common.vendors.hygon.keys import DCU, DEVICES_ALLOCATED, DEVICES_TO_ALLOCATE, NODE_HANDSHAKE, NODE_REGISTER
from hami_common.vendors.hygon.register import encode_register
from hami_common.vendors.plugin import AllocateCall, FakeVendor, HostFile, PluginAnswer, Registration, next_entry

__all__ = ["FAKE_VENDOR", "SLOTS_PER_DCU", "HygonPlugin", "plugin"]

VENDOR: Final = "hygon"
FAKE_VENDOR: Final = FakeVendor(vendor=VENDOR, section=SECTION, enable={}, model="K100_AI", memory_mib=65520)
SLOTS_PER_DCU: Final = 4  # dcu-dp hard-codes count 4 and advertises 4 fake IDs per DCU
PLUGIN_MODE: Final = "hami"
_RENDER_BASE: Final = 128
_FAKE_COMPUTE_UNITS: Final = 64
_FAKE_CU_MASKS: Final = ("0xffffffff", "0xffffffff")
_LIVE: Final = frozenset({"Pending", "Running"})


def _stamp(now: datetime) -> str:
    """Go's ``time.Now().String()`` without the monotonic part: ``2025-01-07 00:00:00.000000000 +0000 UTC``."""
    return f"Reported {now:%Y-%m-%d %H:%M:%S}.{now.microsecond * 1000:09d} {now:%z} {now.tzname() or ''}".rstrip()


@dataclass(frozen=True, slots=True)
class HygonPlugin:
    family: HygonFamily

    @property
    def to_allocate_key(self) -> str | None:
        return DEVICES_TO_ALLOCATE

    def owns(self, gpu: Gpu) -> bool:
        return gpu.vendor == VENDOR

    def _info(self, gpu: Gpu) -> DeviceInfo:
        return DeviceInfo(
            id=gpu.uuid,
            index=gpu.index,
            count=SLOTS_PER_DCU,
            devmem=gpu.memory_mib,
            devcore=FULL_CORES,
            type=f"{DCU}-{gpu.model}",
            mode=PLUGIN_MODE,
            health=gpu.healthy,
        )

    def register(self, node: str, gpus: Sequence[Gpu]) -> Registration:
        devices = tuple(self._info(g) for g in gpus)
        return Registration(annotations={NODE_REGISTER: encode_register(devices)}, devices=devices)

    def handshake(self, now: datetime) -> Mapping[str, str]:
        return {NODE_HANDSHAKE: _stamp(now)}

    def advertised(self, node: str, gpus: Sequence[Gpu]) -> Mapping[str, tuple[str, ...]]:
        ids = tuple(f"{gpu.uuid}-fake-{i}" for gpu in gpus for i in range(SLOTS_PER_DCU))
        return {self.family.config.resource_count_name: ids}

    def socket_name(self, resource: str) -> str:
        return "hygon-dcu.sock"

    def allocate(self, call: AllocateCall) -> PluginAnswer:
        entry = next_entry(call, DEVICES_TO_ALLOCATE)
        pod = entry.pod
        if not call.gpus:
            raise InvalidInput(f"node {call.node} declares no DCU")
        by_uuid = {g.uuid: g for g in call.gpus}
        drm = {g.uuid: DrmNodes(card=g.index, render=_RENDER_BASE + g.index) for g in call.gpus}
        first_memory = call.gpus[0].memory_mib
        slot = None
        if needs_vdcu(entry.devices, first_memory) and entry.devices[0].uuid in by_uuid:
            card = by_uuid[entry.devices[0].uuid]
            # one vdev id per pod sharing the card: the others still holding it come first
            sharing = sum(
                1
                for p in call.pods
                if p.uid != pod.uid and p.phase in _LIVE and card.uuid in p.annotations.get(DEVICES_ALLOCATED, "")
            )
            slot = VdevSlot(
                pci_bus_id=card.bus_id or f"0000:{card.index + 1:02x}:00.0",
                device_id=card.index,
                vdev_id=sharing % SLOTS_PER_DCU,
                pipe_id=0,
                cu_masks=_FAKE_CU_MASKS,
                compute_units=_FAKE_COMPUTE_UNITS,
            )
        contract = allocate_contract(
            entry.devices,
            drm=drm,
            first_card_memory=first_memory,
            pod_uid=pod.uid,
            container=entry.container,
            slot=slot,
        )
        files: tuple[HostFile, ...] = ()
        if contract.vdev_dir and contract.vdev_file and contract.vdev_text is not None:
            files = (HostFile(f"{contract.vdev_dir}/{contract.vdev_file}", contract.vdev_text),)
            if contract.exporter_copy:
                files += (HostFile(contract.exporter_copy, contract.vdev_text),)
        response = ContainerResponse(
            envs=dict(contract.env),
            mounts=tuple(
                Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                for m in contract.mounts
            ),
            devices=tuple(
                DeviceSpec(container_path=d.path, host_path=d.path, permissions=d.permissions) for d in contract.devices
            ),
        )
        return PluginAnswer(
            pod=pod,
            container=entry.container,
            response=response,
            pod_changes={DEVICES_TO_ALLOCATE: entry.rest},
            files=files,
        )


def plugin(family: DeviceFamily) -> HygonPlugin | None:
    return HygonPlugin(family) if isinstance(family, HygonFamily) else None
