"""What dcu-dp answers kubelet's Allocate with (hami-vendors §3.5), as data for the node side.

dcu-dp takes the container's next entry of ``hami.io/dcu-devices-to-allocate`` and answers with device
nodes and mounts, never env vars. A container with exactly one DCU and less memory than the node's first
DCU gets a vDCU: a ``vdev<N>.conf`` file mounted at ``/etc/vdev/docker/`` plus the DTK driver directory.
What the node alone knows (the DRM node numbers of each serial, the pipe/vdev ids and CU masks it picks)
comes in as values; :func:`allocate_contract` only assembles the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from hami_common.annotations.devices import ContainerDevice
from hami_common.errors import InvalidInput
from hami_common.vendors._common import FULL_CORES

__all__ = [
    "DTK_PATH",
    "AllocateContract",
    "DeviceNode",
    "DrmNodes",
    "Mount",
    "VdevSlot",
    "allocate_contract",
    "needs_vdcu",
    "vdev_conf",
]

DTK_PATH: Final = "/opt/dtk"  # $HYGONPATH in dcu-dp's DaemonSet
VDEV_HOST_ROOT: Final = "/usr/local/vgpu/dcu"
VDEV_CONTAINER_DIR: Final = "/etc/vdev/docker/"
VDEV_EXPORTER_DIR: Final = "/etc/vdev"  # a copy for dcu-exporter
DRIVER_CONTAINER_DIR: Final = "/opt/hygondriver"
HYHAL_DIR: Final = "/opt/hyhal"
_ALWAYS: Final = ("/dev/kfd", "/dev/mkfd")


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node passed through at the same path."""

    path: str
    permissions: str


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class DrmNodes:
    """The DRM entries of one DCU (``/dev/dri/card<card>``, ``/dev/dri/renderD<render>``)."""

    card: int
    render: int


@dataclass(frozen=True, slots=True)
class VdevSlot:
    """The vDCU the node side carved: where on the card, and which compute units."""

    pci_bus_id: str
    device_id: int  # dcgm index of the card
    vdev_id: int
    pipe_id: int
    cu_masks: tuple[str, str]  # as dcu-dp writes them, e.g. "0xffffffff"
    compute_units: int  # of the whole card


@dataclass(frozen=True, slots=True)
class AllocateContract:
    """One container's answer: device nodes, mounts, and the vDCU file to write first (if any)."""

    devices: tuple[DeviceNode, ...]
    mounts: tuple[Mount, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # always empty: dcu-dp sets no env vars
    vdev_dir: str | None = None  # host directory that holds vdev_file
    vdev_file: str | None = None  # file name, vdev<N>.conf
    vdev_text: str | None = None
    exporter_copy: str | None = None  # host path of the copy for dcu-exporter


def needs_vdcu(devices: Sequence[ContainerDevice], first_card_memory: int) -> bool:
    """A vDCU exactly when one DCU is granted with less memory than the node's first DCU has."""
    return len(devices) == 1 and devices[0].usedmem < first_card_memory


def vdev_conf(grant: ContainerDevice, slot: VdevSlot) -> str:
    """The ``vdev<N>.conf`` lines: bus id, both CU masks, CUs for the core share, memory, ids, enabled."""
    cu_count = grant.usedcores * slot.compute_units // FULL_CORES
    lines = (
        f"PciBusId: {slot.pci_bus_id}",
        f"cu_mask: {slot.cu_masks[0]}",
        f"cu_mask: {slot.cu_masks[1]}",
        f"cu_count: {cu_count}",
        f"mem: {grant.usedmem} MiB",
        f"device_id: {slot.device_id}",
        f"vdev_id: {slot.vdev_id}",
        f"pipe_id: {slot.pipe_id}",
        "enable: 1",
    )
    return "\n".join(lines) + "\n"


def allocate_contract(
    devices: Sequence[ContainerDevice],
    *,
    drm: Mapping[str, DrmNodes],
    first_card_memory: int,
    pod_uid: str,
    container: str,
    slot: VdevSlot | None = None,
    dtk_path: str = DTK_PATH,
) -> AllocateContract:
    """The answer for one container's entry. InvalidInput for a card the node does not know, or for a vDCU
    grant without the ``slot`` the node side must carve for it (see :func:`needs_vdcu`)."""
    nodes = [DeviceNode(path, "rwm") for path in _ALWAYS]
    for dev in devices:
        found = drm.get(dev.uuid)
        if found is None:
            raise InvalidInput(f"DCU {dev.uuid} is not on this node")
        nodes.append(DeviceNode(f"/dev/dri/card{found.card}", "rw"))
        nodes.append(DeviceNode(f"/dev/dri/renderD{found.render}", "rw"))
    mounts: list[Mount] = []
    vdev_dir = vdev_file = vdev_text = exporter_copy = None
    if needs_vdcu(devices, first_card_memory):
        if slot is None:
            raise InvalidInput(f"DCU {devices[0].uuid}: a vDCU needs a carved slot")
        mask_a, mask_b = slot.cu_masks
        vdev_dir = (
            f"{VDEV_HOST_ROOT}/{pod_uid}_{container}_{slot.device_id}_{slot.pipe_id}_{slot.vdev_id}_{mask_a}_{mask_b}"
        )
        vdev_file = f"vdev{slot.vdev_id}.conf"
        vdev_text = vdev_conf(devices[0], slot)
        exporter_copy = f"{VDEV_EXPORTER_DIR}/{vdev_file}"
        mounts.append(Mount(VDEV_CONTAINER_DIR, vdev_dir, read_only=False))
        mounts.append(Mount(DRIVER_CONTAINER_DIR, dtk_path, read_only=False))
    mounts.append(Mount(HYHAL_DIR, HYHAL_DIR, read_only=True))
    return AllocateContract(
        devices=tuple(nodes),
        mounts=tuple(mounts),
        vdev_dir=vdev_dir,
        vdev_file=vdev_file,
        vdev_text=vdev_text,
        exporter_copy=exporter_copy,
    )
