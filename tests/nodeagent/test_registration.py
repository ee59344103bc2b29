"""Registration: HAMi's device-plugin arithmetic, and the annotation round trip through the kube emulator."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest
from opentelemetry.context import Context

from hami_common import subjects
from hami_common.annotations import (
    NODE_REGISTER,
    NODE_SCORE,
    decode_node_devices,
    decode_pair_scores,
    encode_node_devices,
)
from hami_common.events import NodeInventory
from hami_common.inventory import FakeInventory, Gpu, NodeDeviceConfig
from hami_common.kube import KubeClient
from hami_nodeagent.registration import Registrar, register_devices
from hami_sim.kubeapi import KubeApiEmulator
from tests.nodeagent.conftest import NODE, UUID_A, UUID_B, inventory_doc, write_inventory

SPEC_EXAMPLE = (
    '[{"id":"GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec","count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core","health":true},'
    '{"id":"GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448","index":1,"count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","numa":1,"mode":"hami-core","health":true}]'
)


def _v100(uuid: str, index: int, numa: int, **kw: object) -> Gpu:
    return Gpu(uuid=uuid, index=index, model="Tesla V100-PCIE-32GB", memory_mib=32768, numa=numa, **kw)  # type: ignore[arg-type]


def test_two_v100s_register_as_the_spec_worked_example() -> None:
    devices = register_devices([_v100(UUID_A, 0, 0), _v100(UUID_B, 1, 1)], NodeDeviceConfig())
    assert encode_node_devices(devices) == SPEC_EXAMPLE


@pytest.mark.parametrize(
    ("gpu", "config", "expected"),
    [
        pytest.param(
            Gpu(uuid="G", index=0, model="NVIDIA A100-SXM4-80GB", memory_mib=81920), NodeDeviceConfig(),
            ("NVIDIA A100-SXM4-80GB", 81920, 100, 10), id="a model already starting with NVIDIA keeps its name",
        ),
        pytest.param(
            Gpu(uuid="G", index=0, model="Tesla T4", memory_mib=15360), NodeDeviceConfig(memory_scaling=1.5),
            ("NVIDIA-Tesla T4", 23040, 100, 10), id="memory scaling multiplies and truncates the registered memory",
        ),
        pytest.param(
            Gpu(uuid="G", index=0, model="T4", memory_mib=15001), NodeDeviceConfig(memory_scaling=1.1),
            ("NVIDIA-T4", 16501, 100, 10), id="scaled memory is truncated to whole MiB",
        ),
        pytest.param(
            Gpu(uuid="G", index=0, model="T4", memory_mib=100), NodeDeviceConfig(core_scaling=2, split_count=4),
            ("NVIDIA-T4", 100, 200, 4), id="core scaling and split count shape devcore and count",
        ),
        pytest.param(
            Gpu(uuid="G", index=0, model="T4", memory_mib=0), NodeDeviceConfig(preconfigured_memory_mib=8000),
            ("NVIDIA-T4", 8000, 100, 10), id="memory the driver cannot tell comes from preConfiguredDeviceMemory",
        ),
    ],
)  # fmt: skip
def test_registration_follows_hamis_device_plugin(
    gpu: Gpu, config: NodeDeviceConfig, expected: tuple[str, int, int, int]
) -> None:
    (device,) = register_devices([gpu], config)
    assert (device.type, device.devmem, device.devcore, device.count) == expected


def test_filtered_devices_and_unhealthy_gpus() -> None:
    gpus = [_v100(UUID_A, 0, 0), _v100(UUID_B, 1, -1, healthy=False), _v100("GPU-c", 2, 0)]
    devices = register_devices(gpus, NodeDeviceConfig(filter_uuids=frozenset({"GPU-c"})))
    assert [d.id for d in devices] == [UUID_A, UUID_B]
    assert (devices[1].health, devices[1].numa) == (False, 0)
    assert [d.id for d in register_devices(gpus, NodeDeviceConfig(filter_indices=frozenset({0})))] == [UUID_B, "GPU-c"]


@dataclass
class Recorder:
    """A Publisher that keeps what it was given."""

    sent: list[tuple[str, msgspec.Struct]] = field(default_factory=list)

    async def publish(self, subject: str, event: msgspec.Struct, *, ctx: Context | None = None) -> None:
        self.sent.append((subject, event))


def _registrar(kube: KubeClient, inventory_file: Path, publisher: Recorder, topology: bool = False) -> Registrar:
    return Registrar(
        node=NODE, inventory=FakeInventory(inventory_file, NODE), nodes=kube, publisher=publisher, topology=topology
    )


async def test_registration_round_trips_through_the_apiserver(
    kube: KubeClient, node: str, inventory_file: Path
) -> None:
    registrar = _registrar(kube, inventory_file, Recorder())
    assert await registrar.scan() is True
    annotations = (await kube.get_node(node)).metadata.annotations
    devices = decode_node_devices(annotations[NODE_REGISTER])
    assert devices == register_devices(FakeInventory(inventory_file, NODE).gpus(), NodeDeviceConfig())
    assert [(d.id, d.type, d.devmem, d.numa, d.health) for d in devices] == [
        (UUID_A, "NVIDIA-Tesla V100-PCIE-32GB", 32768, 0, True),
        (UUID_B, "NVIDIA A100-SXM4-80GB", 81920, 1, True),
    ]
    assert NODE_SCORE not in annotations


async def test_unchanged_registration_is_not_patched_again(
    kube: KubeClient, node: str, inventory_file: Path, emulator: KubeApiEmulator
) -> None:
    registrar = _registrar(kube, inventory_file, Recorder())
    await registrar.scan()
    patches = emulator.count("PATCH", f"/api/v1/nodes/{node}")
    assert await registrar.scan() is False
    assert await registrar.scan(check_node=True) is False
    assert emulator.count("PATCH", f"/api/v1/nodes/{node}") == patches == 1


async def test_health_change_is_in_the_annotation_after_one_scan(
    kube: KubeClient, node: str, inventory_file: Path
) -> None:
    registrar = _registrar(kube, inventory_file, Recorder())
    await registrar.scan()
    write_inventory(inventory_file, inventory_doc(healthy_b=False))
    assert await registrar.scan() is True
    raw = (await kube.get_node(node)).metadata.annotations[NODE_REGISTER]
    assert [d.health for d in decode_node_devices(raw)] == [True, False]
    assert '"health"' not in raw.split(UUID_B)[1]  # HAMi omits false: absent health means unhealthy


async def test_annotation_removed_by_someone_else_is_restored_at_the_full_check(
    kube: KubeClient, node: str, inventory_file: Path
) -> None:
    registrar = _registrar(kube, inventory_file, Recorder())
    await registrar.scan()
    await kube.patch_node_annotations(node, {NODE_REGISTER: None})
    assert await registrar.scan() is False  # a health poll trusts what it sent
    assert await registrar.scan(check_node=True) is True
    assert NODE_REGISTER in (await kube.get_node(node)).metadata.annotations


async def test_topology_scores_are_written_when_enabled(kube: KubeClient, node: str, inventory_file: Path) -> None:
    registrar = _registrar(kube, inventory_file, Recorder(), topology=True)
    await registrar.scan()
    scores = decode_pair_scores((await kube.get_node(node)).metadata.annotations[NODE_SCORE])
    assert scores == {UUID_A: {UUID_B: 220}, UUID_B: {UUID_A: 220}}


async def test_inventory_is_published_on_change_and_at_full_checks(
    kube: KubeClient, node: str, inventory_file: Path
) -> None:
    publisher = Recorder()
    registrar = _registrar(kube, inventory_file, publisher)
    await registrar.scan()
    await registrar.scan()
    await registrar.scan(check_node=True)
    assert [s for s, _ in publisher.sent] == [subjects.inventory(node)] * 2
    event = publisher.sent[0][1]
    assert isinstance(event, NodeInventory)
    assert (event.node, [d.id for d in event.devices]) == (node, [UUID_A, UUID_B])
