"""The GPUs of one node as values, the port that discovers them, and the topology pair scores (pure)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from hami_common.annotations.registration import MigProfile

__all__ = [
    "NVIDIA_VENDOR",
    "NVLINK_SCORE",
    "Gpu",
    "GpuInventory",
    "GpuLink",
    "GpuStats",
    "PairScoreReport",
    "PcieLevel",
    "pair_scores",
]

# The vendor of a GPU discovered through NVML, and of every fake GPU that declares none. Other words
# (``ascend``, ``cambricon``, ``hygon``) only come from the fake inventory, where the node agent and the allocator
# play those vendors' device plugins (hami_common.vendors.plugin).
NVIDIA_VENDOR: Final = "nvidia"
NVLINK_SCORE: Final = 100  # per NVLink between the two GPUs (hami-protocol §2.3)
MAX_NVLINKS: Final = 18


class PcieLevel(enum.StrEnum):
    """How far apart two GPUs sit on PCIe (NVML's topology levels); the value is the fake inventory's word."""

    CROSS_CPU = "cross-cpu"  # NVML_TOPOLOGY_SYSTEM
    SAME_CPU = "same-cpu"  # NVML_TOPOLOGY_NODE
    HOST_BRIDGE = "host-bridge"  # NVML_TOPOLOGY_HOSTBRIDGE
    MULTI_SWITCH = "multi-switch"  # NVML_TOPOLOGY_MULTIPLE
    SINGLE_SWITCH = "single-switch"  # NVML_TOPOLOGY_SINGLE
    SAME_BOARD = "same-board"  # NVML_TOPOLOGY_INTERNAL

    @property
    def score(self) -> int:
        return _PCIE_SCORES[self]


_PCIE_SCORES: Final = {
    PcieLevel.CROSS_CPU: 10,
    PcieLevel.SAME_CPU: 20,
    PcieLevel.HOST_BRIDGE: 30,
    PcieLevel.MULTI_SWITCH: 40,
    PcieLevel.SINGLE_SWITCH: 50,
    PcieLevel.SAME_BOARD: 60,
}


@dataclass(frozen=True, slots=True)
class GpuLink:
    """This GPU's view of its connection to ``peer``: the PCIe level and the number of NVLinks."""

    peer: str  # the other GPU's UUID
    pcie: PcieLevel | None = None
    nvlinks: int = 0

    @property
    def score(self) -> int:
        return (self.pcie.score if self.pcie is not None else 0) + NVLINK_SCORE * min(self.nvlinks, MAX_NVLINKS)


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU as discovery sees it now."""

    uuid: str
    index: int
    model: str  # the NVML name, e.g. "Tesla V100-PCIE-32GB" (registration adds the NVIDIA- prefix)
    memory_mib: int  # 0 when the driver cannot tell (registration then uses preConfiguredDeviceMemory)
    numa: int = 0  # from sysfs; a negative value is reported as 0
    healthy: bool = True
    bus_id: str = ""
    links: tuple[GpuLink, ...] = ()
    # the MIG profiles the GPU offers with their placements; empty unless MIG mode is on (hami-protocol §2.2)
    mig_profiles: tuple[MigProfile, ...] = ()
    vendor: str = NVIDIA_VENDOR  # the device family's fake-inventory word; NVML only ever finds NVIDIA GPUs

    @property
    def is_nvidia(self) -> bool:
        return self.vendor == NVIDIA_VENDOR

    @property
    def mig(self) -> bool:
        """True when the GPU is in MIG mode: it is cut into instances, never shared through the interposer."""
        return bool(self.mig_profiles)

    def link_to(self, peer: str) -> GpuLink | None:
        return next((link for link in self.links if link.peer == peer), None)


@dataclass(frozen=True, slots=True)
class GpuStats:
    """Host-wide figures of one GPU, joined to the per-container usage."""

    uuid: str
    memory_used_bytes: int
    utilization_percent: int  # NVML utilization.gpu
    memory_utilization_percent: int = 0  # NVML utilization.memory


class GpuInventory(Protocol):
    """The GPUs of this node. Blocking (NVML, file reads): services call it through ``asyncio.to_thread``.

    ``gpus()`` re-checks health on every call, so a caller that polls it sees a device go unhealthy.
    """

    @property
    def kind(self) -> str: ...

    def gpus(self) -> tuple[Gpu, ...]: ...

    def stats(self) -> tuple[GpuStats, ...]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class PairScoreReport:
    scores: dict[str, dict[str, int]]  # uuid -> other uuid -> score, for hami.io/node-nvidia-score
    asymmetric: tuple[tuple[str, str], ...]  # pairs whose NVLink counts differ by direction: scored 0


def pair_scores(gpus: Sequence[Gpu]) -> PairScoreReport:
    """Score every ordered pair of GPUs by their links; a pair seen differently from its two ends scores 0."""
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    scores: dict[str, dict[str, int]] = {}
    asymmetric: list[tuple[str, str]] = []
    for gpu in gpus:
        row: dict[str, int] = {}
        for other in gpus:
            if other.uuid == gpu.uuid:
                continue
            there = gpu.link_to(other.uuid)
            back = by_uuid[other.uuid].link_to(gpu.uuid)
            mine = there.nvlinks if there else 0
            theirs = back.nvlinks if back else 0
            if mine != theirs:
                row[other.uuid] = 0
                if gpu.uuid < other.uuid:
                    asymmetric.append((gpu.uuid, other.uuid))
                continue
            row[other.uuid] = there.score if there else 0
        scores[gpu.uuid] = row
    return PairScoreReport(scores=scores, asymmetric=tuple(asymmetric))
