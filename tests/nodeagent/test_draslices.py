"""The node agent's DRA mode: the publisher writes the node's pool when its GPUs change, re-writes slices
someone removed, and takes over a pool a previous agent left. The store here is a dictionary; the real
apiserver takes these writes in tests/realk8s/test_dra_allocation.py."""

from __future__ import annotations

from pathlib import Path

import msgspec

from hami_common.dra.objects import ResourceSlice
from hami_common.dra.slices import MIB, slice_name
from hami_common.errors import NotFound
from hami_common.inventory import FakeInventory, Gpu, NodeDeviceConfig
from hami_nodeagent.draslices import PublishedSlice, SlicePublisher
from hami_nodeagent.registration import register_devices
from tests.nodeagent.conftest import NODE, UUID_B, inventory_doc, write_inventory


class DictStore:
    def __init__(self) -> None:
        self.slices: dict[str, ResourceSlice] = {}
        self.versions: dict[str, int] = {}
        self.incarnation = 1  # a Node deleted and registered again gets a new uid

    async def node_uid(self, node: str) -> str:
        return f"uid-of-{node}-{self.incarnation}"

    async def list(self, node: str) -> list[PublishedSlice]:
        return [
            msgspec.convert(
                {
                    "metadata": {"name": n, "resourceVersion": str(self.versions[n])},
                    "spec": msgspec.to_builtins(s.spec),
                },
                PublishedSlice,
            )
            for n, s in self.slices.items()
            if s.spec.node_name == node
        ]

    async def create(self, body: ResourceSlice) -> None:
        assert body.metadata.name not in self.slices
        self.slices[body.metadata.name] = body
        self.versions[body.metadata.name] = 1

    async def replace(self, body: ResourceSlice, resource_version: str) -> None:
        assert self.versions[body.metadata.name] == int(resource_version)
        self.slices[body.metadata.name] = body
        self.versions[body.metadata.name] += 1

    async def delete(self, name: str) -> None:
        if self.slices.pop(name, None) is None:
            raise NotFound(name)


def _publisher(inventory_file: Path, store: DictStore) -> SlicePublisher:
    return SlicePublisher(node=NODE, inventory=FakeInventory(inventory_file, NODE), store=store)


def _devices(store: DictStore) -> list[str]:
    return [d.name for s in store.slices.values() for d in s.spec.devices]


async def test_the_pool_is_written_once_and_again_only_when_the_gpus_change(inventory_file: Path) -> None:
    store = DictStore()
    publisher = _publisher(inventory_file, store)
    assert await publisher.sync()
    [published] = store.slices.values()
    assert (published.spec.pool.generation, _devices(store)) == (1, ["hami-gpu-0", "hami-gpu-1"])
    assert published.metadata.owner_references[0].uid == f"uid-of-{NODE}-1"
    assert not await publisher.sync()
    assert not await publisher.sync(check=True)
    assert publisher.writes == 1

    write_inventory(inventory_file, inventory_doc(healthy_b=False))  # GPU B fails: it leaves the pool
    assert await publisher.sync()
    [published] = store.slices.values()
    assert (published.spec.pool.generation, _devices(store)) == (2, ["hami-gpu-0"])


async def test_slices_removed_by_someone_else_come_back_at_the_next_check(inventory_file: Path) -> None:
    store = DictStore()
    publisher = _publisher(inventory_file, store)
    await publisher.sync()
    store.slices.clear()  # what a starting kubelet does to a node's slices, or the collector to a new Node's
    store.incarnation = 2
    assert not await publisher.sync()  # a poll without a check trusts what it wrote
    assert await publisher.sync(check=True)
    assert _devices(store) == ["hami-gpu-0", "hami-gpu-1"]
    [published] = store.slices.values()
    assert published.spec.pool.generation == 2
    assert published.metadata.owner_references[0].uid == f"uid-of-{NODE}-2"  # owned by the Node as it is now


async def test_a_restarted_agent_supersedes_the_pool_it_left_and_removes_extra_slices(inventory_file: Path) -> None:
    store = DictStore()
    first = _publisher(inventory_file, store)
    await first.sync()
    leftover = next(iter(store.slices.values()))
    extra = slice_name(NODE, 1)
    store.slices[extra] = msgspec.structs.replace(
        leftover, metadata=msgspec.structs.replace(leftover.metadata, name=extra)
    )
    store.versions[extra] = 1

    second = _publisher(inventory_file, store)
    assert await second.sync()
    assert list(store.slices) == [slice_name(NODE, 0)]
    assert store.slices[slice_name(NODE, 0)].spec.pool.generation == 2


async def test_a_gpu_offers_in_dra_mode_what_it_registers_in_extender_mode() -> None:
    config = NodeDeviceConfig(memory_scaling=1.25, core_scaling=1.5)
    gpu = Gpu(uuid=UUID_B, index=1, model="NVIDIA A100-SXM4-80GB", memory_mib=81920)
    [registered] = register_devices((gpu,), config)
    store = DictStore()
    publisher = SlicePublisher(node=NODE, inventory=_Fixed((gpu,)), store=store, config=config)
    await publisher.sync()
    [device] = next(iter(store.slices.values())).spec.devices
    assert int(device.capacity["memory"].value) == registered.devmem * MIB
    assert int(device.capacity["cores"].value) == registered.devcore


class _Fixed:
    kind = "fixed"

    def __init__(self, gpus: tuple[Gpu, ...]) -> None:
        self._gpus = gpus

    def gpus(self) -> tuple[Gpu, ...]:
        return self._gpus

    def stats(self) -> tuple[()]:
        return ()

    def close(self) -> None:
        pass
