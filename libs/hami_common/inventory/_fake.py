"""A declared inventory: the GPUs of each node written in a YAML file, for CPU-only machines and the simulator.

::

    nodes:
      node-a:
        - uuid: GPU-5e4f0c1a-0000-4000-8000-000000000001
          index: 0
          model: Tesla V100-PCIE-32GB
          memory_mib: 32768
          numa: 0
          healthy: true
          links: [{peer: GPU-5e4f0c1a-0000-4000-8000-000000000002, nvlinks: 2, pcie: same-cpu}]
          used_mib: 1024      # host figures the usage stream joins (optional)
          utilization: 35
        - uuid: GPU-5e4f0c1a-0000-4000-8000-000000000003
          model: NVIDIA A100-SXM4-80GB
          memory_mib: 81920
          mig: true           # MIG mode on: the model's profile table (inventory/_migprofiles.py) applies
      npu-node:
        - uuid: npu-die-0
          vendor: ascend      # another device family (default nvidia): the node agent and the allocator
          model: Ascend910B3  # play its device plugin; the model names the chip (a common word or chip name)
          memory_mib: 65536

The file is read again on every call (it is small) and decoded again when it changed, so editing
``healthy`` is how a test (or ``make run``) breaks a GPU. A file that does not follow this form raises
:class:`~hami_common.errors.InvalidInput`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import msgspec
import yaml

from hami_common.errors import InvalidInput
from hami_common.inventory._migprofiles import MIG_CARDS, mig_card
from hami_common.inventory._model import NVIDIA_VENDOR, Gpu, GpuLink, GpuStats, PcieLevel

__all__ = ["FAKE", "FakeInventory", "decode_fake_inventory"]

FAKE: Final = "fake"
_MIB: Final = 1024 * 1024
_MAX_FILE_BYTES: Final = 4 << 20


class _Link(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    peer: str
    nvlinks: int = 0
    pcie: PcieLevel | None = None


class _Gpu(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    uuid: str
    model: str
    memory_mib: int
    index: int | None = None
    numa: int = 0
    healthy: bool = True
    bus_id: str = ""
    links: tuple[_Link, ...] = ()
    used_mib: int = 0
    utilization: int = 0
    memory_utilization: int = 0
    mig: bool = False  # MIG mode on; the model must have a profile table
    vendor: str = NVIDIA_VENDOR  # the device family: nvidia, ascend, cambricon, hygon


# libyaml's safe loader parses ~20x faster than the pure-Python one: a cluster-wide file of 100 nodes was read
# by each node's agent and allocator, two seconds apiece
_LOADER: Final[type[yaml.SafeLoader]] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _File(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    nodes: dict[str, tuple[_Gpu, ...]]


def decode_fake_inventory(text: str | bytes, node: str) -> tuple[tuple[Gpu, ...], tuple[GpuStats, ...]]:
    """The GPUs declared for ``node`` and their host figures; InvalidInput names what is wrong."""
    try:
        raw = yaml.load(text, Loader=_LOADER)  # a safe loader: the C one when libyaml is there
        declared = msgspec.convert(raw, _File)
    except (yaml.YAMLError, msgspec.ValidationError) as err:
        raise InvalidInput(f"fake inventory: {err}") from err
    if node not in declared.nodes:
        raise InvalidInput(f"fake inventory: node {node!r} is not declared")
    entries = declared.nodes[node]
    gpus: list[Gpu] = []
    stats: list[GpuStats] = []
    for position, entry in enumerate(entries):
        if not entry.uuid or entry.memory_mib < 0 or entry.used_mib < 0 or (entry.index or 0) < 0:
            raise InvalidInput(f"fake inventory: GPU {position} of {node} needs a uuid and non-negative figures")
        if any(link.nvlinks < 0 for link in entry.links):
            raise InvalidInput(f"fake inventory: GPU {entry.uuid} declares a negative NVLink count")
        vendor = entry.vendor.strip().lower()
        if not vendor or (entry.mig and vendor != NVIDIA_VENDOR):
            raise InvalidInput(f"fake inventory: GPU {entry.uuid} declares vendor {entry.vendor!r} (MIG is NVIDIA's)")
        card = mig_card(entry.model) if entry.mig else None
        if entry.mig and card is None:
            raise InvalidInput(
                f"fake inventory: GPU {entry.uuid} declares mig but model {entry.model!r} offers no MIG; "
                f"models with MIG: {', '.join(c.key for c in MIG_CARDS)}"
            )
        gpus.append(
            Gpu(
                uuid=entry.uuid,
                index=position if entry.index is None else entry.index,
                model=entry.model,
                memory_mib=entry.memory_mib,
                numa=max(entry.numa, 0),
                healthy=entry.healthy,
                bus_id=entry.bus_id,
                links=tuple(GpuLink(peer=lk.peer, pcie=lk.pcie, nvlinks=lk.nvlinks) for lk in entry.links),
                mig_profiles=card.hami_profiles() if card is not None else (),
                vendor=vendor,
            )
        )
        stats.append(GpuStats(entry.uuid, entry.used_mib * _MIB, entry.utilization, entry.memory_utilization))
    if len({g.uuid for g in gpus}) != len(gpus) or len({(g.vendor, g.index) for g in gpus}) != len(gpus):
        raise InvalidInput(f"fake inventory: node {node} lists a GPU (uuid, or index of one vendor) twice")
    return tuple(gpus), tuple(stats)


class FakeInventory:
    """:class:`~hami_common.inventory.GpuInventory` over a declared YAML file, re-read when it changes."""

    def __init__(self, path: Path | str, node: str) -> None:
        self.path = Path(path)
        self.node = node
        self._text: bytes | None = None
        self._gpus: tuple[Gpu, ...] = ()
        self._stats: tuple[GpuStats, ...] = ()
        self._load()  # a missing or malformed file fails at start-up, where it is configured

    @property
    def kind(self) -> str:
        return FAKE

    def _load(self) -> None:
        try:
            with open(self.path, "rb") as f:
                text = f.read(_MAX_FILE_BYTES + 1)
        except OSError as err:
            raise InvalidInput(f"fake inventory {self.path}: {err.strerror or err}") from err
        if len(text) > _MAX_FILE_BYTES:
            raise InvalidInput(f"fake inventory {self.path}: larger than {_MAX_FILE_BYTES} bytes")
        if text == self._text:
            return
        self._gpus, self._stats = decode_fake_inventory(text, self.node)
        self._text = text

    def gpus(self) -> tuple[Gpu, ...]:
        self._load()
        return self._gpus

    def stats(self) -> tuple[GpuStats, ...]:
        self._load()
        return self._stats

    def close(self) -> None:
        """Nothing to release."""
