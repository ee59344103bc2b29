"""The Ascend device plugin's node side for declared NPUs (ascend-dp v1.4.0; hami-vendors §1.2, §1.7).

Registration: ``hami.io/node-register-<CommonWord>`` as ascend-dp writes it (list position as ``index``, the
die id as ``id``, slots as ``count``, ``memoryAllocatable`` as ``devmem``, ``aiCore`` or 100 on a
hami-vnpu-core node as ``devcore``, NetworkID 0 for positions 0-3 and 1 from 4 on, 910C always 0),
``hami-vnpu-core``, and ``Reported_<YYYY.MM.DD HH:MM:SS>`` on the handshake key with every report.
kubelet sees ``slots`` devices ``<die>-<i>`` per NPU of ``huawei.com/<CommonWord>`` on ``<CommonWord>.sock``.

Allocate answers from the pod's ``hami.io/<CommonWord>-devices-to-allocate`` entry and ``huawei.com/<CW>``:
``ASCEND_VISIBLE_DEVICES`` (physical ids: the declared index), ``ASCEND_VNPU_SPECS`` for a hard-split
template, and in hami-core mode the NPU_* variables and mounts of the table in §1.7.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import msgspec

from hami_common.allocation import ContainerResponse, Mount
from hami_common.annotations import DeviceInfo
from hami_common.errors import InvalidInput
from hami_common.inventory import Gpu
from hami_common.vendors._family import DeviceFamily
from hami_common.vendors.ascend import keys
from hami_common.vendors.ascend.admission import is_hami_core
from hami_common.vendors.ascend.config import VNPUS_SECTION
from hami_common.vendors.ascend.family import AscendFamily, NpuRuntime
from hami_common.vendors.ascend.register import RegisteredNpu, encode_register, plugin_network_id
from hami_common.vendors.plugin import AllocateCall, FakeVendor, PluginAnswer, Registration, next_entry

__all__ = ["FAKE_VENDOR", "AscendPlugin", "plugin"]

VENDOR: Final = "ascend"
FAKE_VENDOR: Final = FakeVendor(
    vendor=VENDOR, section=VNPUS_SECTION, enable={"enabled": True}, model="Ascend910B3", memory_mib=65536
)

# Allocate's env (ascend-dp: internal/server/allocate.go)
ASCEND_VNPU_SPECS: Final = "ASCEND_VNPU_SPECS"
NPU_MEM_QUOTA: Final = "NPU_MEM_QUOTA"
NPU_PRIORITY: Final = "NPU_PRIORITY"
NPU_GLOBAL_SHM_PATH: Final = "NPU_GLOBAL_SHM_PATH"
NPU_LOCAL_SHM_PATH: Final = "NPU_LOCAL_SHM_PATH"
_SHARED_REGION: Final = "/hami-shared-region"
_LOCAL_SHMEM: Final = "/hami-vnpu-shmem"
_VNPU_CORE_DIR: Final = "/usr/local/hami-vnpu-core"
_DRIVER_FILES: Final = (
    "/usr/local/bin/npu-smi",
    "/etc/ascend_install.info",
    "/usr/local/Ascend/driver/lib64/driver",
    "/usr/local/Ascend/driver/version.info",
)
_RUNTIME: Final = msgspec.json.Decoder(list[NpuRuntime])


def _stamp(now: datetime) -> str:
    return f"Reported_{now:%Y.%m.%d %H:%M:%S}"


@dataclass(frozen=True, slots=True)
class AscendPlugin:
    family: AscendFamily

    @property
    def word(self) -> str:
        return self.family.word

    @property
    def to_allocate_key(self) -> str | None:
        return keys.devices_to_allocate_key(self.word)

    @property
    def slots(self) -> int:
        """Devices per NPU: memoryAllocatable over the smallest template, 1 without templates."""
        chip = self.family.chip
        templates = chip.templates_by_memory
        if not templates:
            return 1
        return max(chip.memory_allocatable // templates[0].memory, 1)

    def owns(self, gpu: Gpu) -> bool:
        chip = self.family.chip
        return gpu.vendor == VENDOR and gpu.model in {chip.common_word, chip.chip_name}

    def register(self, node: str, gpus: Sequence[Gpu]) -> Registration:
        chip = self.family.chip
        soft = self.family.hami_vnpu_core
        npus = []
        for position, gpu in enumerate(gpus):
            network = plugin_network_id(self.word, position)
            npus.append(
                RegisteredNpu(
                    id=gpu.uuid,
                    index=position,
                    count=self.slots,
                    devmem=chip.memory_allocatable,
                    devcore=100 if soft else chip.ai_core,
                    type=self.word,
                    health=gpu.healthy,
                    custominfo=None if network is None else {keys.NETWORK_ID: network},
                )
            )
        devices = tuple(
            DeviceInfo(
                id=n.id, index=n.index, count=n.count, devmem=n.devmem, devcore=n.devcore, type=n.type, health=n.health
            )
            for n in npus
        )
        annotations = {
            keys.register_key(self.word): encode_register(tuple(npus)),
            keys.NODE_VNPU_CORE: "true" if soft else "false",
        }
        return Registration(annotations=annotations, devices=devices)

    def handshake(self, now: datetime) -> Mapping[str, str]:
        return {keys.handshake_key(self.word): _stamp(now)}

    def advertised(self, node: str, gpus: Sequence[Gpu]) -> Mapping[str, tuple[str, ...]]:
        ids = tuple(f"{gpu.uuid}-{i}" for gpu in gpus for i in range(self.slots))
        return {self.family.chip.resource_name: ids}

    def socket_name(self, resource: str) -> str:
        return f"{self.word}.sock"

    def allocate(self, call: AllocateCall) -> PluginAnswer:
        key = keys.devices_to_allocate_key(self.word)
        entry = next_entry(call, key)
        pod = entry.pod
        where = f"pod {pod.namespace}/{pod.name}"
        physical = {gpu.uuid: gpu.index for gpu in call.gpus}
        unknown = [d.uuid for d in entry.devices if d.uuid not in physical]
        if unknown:
            raise InvalidInput(f"{where}: NPUs {unknown} are not on node {call.node}")
        runtime_value = pod.annotations.get(keys.runtime_key(self.word))
        if runtime_value is None:
            raise InvalidInput(f"{where}: no {keys.runtime_key(self.word)} annotation")
        try:
            runtime = {r.uuid: r for r in _RUNTIME.decode(runtime_value)}
        except msgspec.DecodeError as err:
            raise InvalidInput(f"{where}: {keys.runtime_key(self.word)}: {err}") from err
        granted = [runtime.get(d.uuid, NpuRuntime(uuid=d.uuid)) for d in entry.devices]
        env = {keys.ASCEND_VISIBLE_DEVICES: ",".join(str(physical[d.uuid]) for d in entry.devices)}
        mounts: tuple[Mount, ...] = ()
        if is_hami_core(pod.annotations):
            first = granted[0]
            env[NPU_MEM_QUOTA] = str(first.memory)
            if first.core > 0:
                env[NPU_PRIORITY] = str(first.core)
            env[NPU_GLOBAL_SHM_PATH] = f"{_SHARED_REGION}/{physical[first.uuid]}_global_registry"
            env[NPU_LOCAL_SHM_PATH] = f"{_LOCAL_SHMEM}/vnpu_local_shmem"
            mounts = (
                *(Mount(container_path=p, host_path=p, read_only=True) for p in _DRIVER_FILES),
                Mount(container_path="/hami-vnpu-core", host_path=_VNPU_CORE_DIR, read_only=True),
                Mount(container_path="/etc/ld.so.preload", host_path=f"{_VNPU_CORE_DIR}/ld.so.preload", read_only=True),
                Mount(container_path=_SHARED_REGION, host_path="/usr/local/hami-shared-region"),
                Mount(
                    container_path=_LOCAL_SHMEM,
                    host_path=f"{call.hook_path}/hami-vnpu-core/containers/{pod.uid}_{entry.container}",
                ),
            )
        else:
            template = next((r.temp for r in granted if r.temp), "")
            if template:
                env[ASCEND_VNPU_SPECS] = template
        return PluginAnswer(
            pod=pod,
            container=entry.container,
            response=ContainerResponse(envs=env, mounts=mounts),
            pod_changes={key: entry.rest},
        )


def plugin(family: DeviceFamily) -> AscendPlugin | None:
    return AscendPlugin(family) if isinstance(family, AscendFamily) else None
