"""Declared devices of other vendors: the node agent registers them as each vendor's device plugin would, and
each family's own decoder (what the scheduler runs) reads back exactly the devices declared."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from opentelemetry.context import Context

from hami_common.annotations import NODE_PLACEMENTS, NODE_REGISTER, decode_node_devices
from hami_common.deviceconfig import parse_device_config
from hami_common.errors import InvalidInput
from hami_common.events import NodeInventory
from hami_common.inventory import FakeInventory, decode_fake_inventory
from hami_common.kube import KubeClient
from hami_common.vendors import NodeView
from hami_common.vendors.plugin import VendorPlugin, plugins
from hami_nodeagent.registration import Registrar
from tests.nodeagent.conftest import NODE, UUID_A, write_inventory

ALL_VENDORS = "vnpus: {enabled: true}\ncambricon: {}\nhygon: {}\n"


def _doc() -> dict[str, Any]:
    npus = [
        {"uuid": f"die-{i}", "index": i, "vendor": "ascend", "model": "Ascend910B3", "memory_mib": 65536}
        for i in range(6)
    ]
    return {
        "nodes": {
            NODE: [
                {"uuid": UUID_A, "model": "Tesla V100-PCIE-32GB", "memory_mib": 32768},
                *npus,
                {"uuid": "DCU-1234567890", "index": 6, "vendor": "hygon", "model": "K100_AI", "memory_mib": 65520},
                {"uuid": "DCU-1234567891", "index": 7, "vendor": "hygon", "model": "K100_AI", "memory_mib": 65520,
                 "healthy": False},
                {"uuid": "MLU-a", "index": 8, "vendor": "cambricon", "model": "MLU370", "memory_mib": 49152},
                {"uuid": "MLU-b", "index": 9, "vendor": "cambricon", "model": "MLU370", "memory_mib": 49152},
            ]
        }
    }  # fmt: skip


@dataclass
class Recorder:
    sent: list[tuple[str, msgspec.Struct]] = field(default_factory=list)

    async def publish(self, subject: str, event: msgspec.Struct, *, ctx: Context | None = None) -> None:
        self.sent.append((subject, event))


def _plugins(text: str = ALL_VENDORS) -> tuple[VendorPlugin, ...]:
    return plugins(parse_device_config(text).families)


def _registrar(kube: KubeClient, path: Path, publisher: Recorder, found: tuple[VendorPlugin, ...]) -> Registrar:
    return Registrar(node=NODE, inventory=FakeInventory(path, NODE), nodes=kube, publisher=publisher, plugins=found)


def _family(found: tuple[VendorPlugin, ...], word: str) -> VendorPlugin:
    return next(p for p in found if p.family.word == word)


@pytest.fixture
def vendor_inventory(tmp_path: Path) -> Path:
    return write_inventory(tmp_path / "inventory.yaml", _doc())


async def test_each_family_decodes_the_registration_the_agent_wrote(
    kube: KubeClient, node: str, vendor_inventory: Path
) -> None:
    found = _plugins()
    await _registrar(kube, vendor_inventory, Recorder(), found).scan(check_node=True)
    annotations = (await kube.get_node(node)).metadata.annotations
    view = NodeView(name=node, annotations=annotations)

    npus = _family(found, "Ascend910B3").family.node_devices(view)
    assert [d.id for d in npus] == [f"die-{i}" for i in range(6)]
    assert {(d.count, d.totalmem, d.totalcore, d.type) for d in npus} == {(4, 65536, 20, "Ascend910B3")}
    assert [d.network_id for d in npus] == [0, 0, 0, 0, 1, 1]  # two HCCS groups: positions 0-3, 4-7
    assert annotations["hami-vnpu-core"] == "false"

    dcus = _family(found, "DCU").family.node_devices(view)
    assert [(d.id, d.count, d.totalmem, d.type, d.health) for d in dcus] == [
        ("DCU-1234567890", 4, 65520, "DCU-K100_AI", True),
        ("DCU-1234567891", 4, 65520, "DCU-K100_AI", False),
    ]

    # the NVIDIA registration holds the NVIDIA GPU only
    assert [d.id for d in decode_node_devices(annotations[NODE_REGISTER])] == [UUID_A]
    # Cambricon writes nothing: its MLUs come from node capacity
    assert not [k for k in annotations if "mlu" in k.lower()]


async def test_every_report_answers_the_handshake_with_reported(
    kube: KubeClient, node: str, vendor_inventory: Path
) -> None:
    registrar = _registrar(kube, vendor_inventory, Recorder(), _plugins())
    await registrar.scan(check_node=True)
    await kube.patch_node_annotations(
        node,
        {
            "hami.io/node-handshake-Ascend910B3": "Requesting_2026-01-01 00:00:00",
            "hami.io/node-handshake-dcu": "Requesting_2026-01-01 00:00:00",
        },
    )
    await registrar.scan()  # a health poll with nothing changed writes nothing
    assert (await kube.get_node(node)).metadata.annotations["hami.io/node-handshake-dcu"].startswith("Requesting")
    await registrar.scan(check_node=True)  # the full check is the plugin's report
    annotations = (await kube.get_node(node)).metadata.annotations
    assert annotations["hami.io/node-handshake-Ascend910B3"].startswith("Reported_")
    assert annotations["hami.io/node-handshake-dcu"].startswith("Reported ")


async def test_an_agent_without_configured_families_writes_no_vendor_annotation(
    kube: KubeClient, node: str, vendor_inventory: Path
) -> None:
    await _registrar(kube, vendor_inventory, Recorder(), ()).scan(check_node=True)
    annotations = (await kube.get_node(node)).metadata.annotations
    assert set(annotations) == {NODE_REGISTER, NODE_PLACEMENTS}
    assert [d.id for d in decode_node_devices(annotations[NODE_REGISTER])] == [UUID_A]


async def test_inventory_event_lists_every_familys_devices_by_type(
    kube: KubeClient, node: str, vendor_inventory: Path
) -> None:
    publisher = Recorder()
    await _registrar(kube, vendor_inventory, publisher, _plugins()).scan(check_node=True)
    event = publisher.sent[-1][1]
    assert isinstance(event, NodeInventory)
    types = [d.type for d in event.devices]
    assert types.count("NVIDIA-Tesla V100-PCIE-32GB") == 1
    assert types.count("Ascend910B3") == 6
    assert types.count("DCU-K100_AI") == 2
    mlus = [d for d in event.devices if d.type == "MLU"]
    assert [(d.id, d.devmem, d.count) for d in mlus] == [
        (f"{NODE}-cambricon-mlu-0", 49152, 100),
        (f"{NODE}-cambricon-mlu-1", 49152, 100),
    ]


def test_cambricon_capacity_gives_back_the_declared_mlus() -> None:
    """HAMi invents the MLUs from the capacity the plugin serves: the same count and memory come back."""
    found = _plugins()
    mlu = _family(found, "MLU")
    doc = _doc()["nodes"][NODE]
    declared, _ = decode_fake_inventory(yaml.safe_dump({"nodes": {NODE: doc}}), NODE)
    mine = [g for g in declared if mlu.owns(g)]
    capacity = {r: str(len(ids)) for r, ids in mlu.advertised(NODE, mine).items()}
    assert capacity == {"cambricon.com/mlu.smlu.vcore": "200", "cambricon.com/mlu.smlu.vmemory": "384"}
    devices = mlu.family.node_devices(NodeView(name=NODE, capacity=capacity))
    assert [(d.id, d.totalmem) for d in devices] == [(f"{NODE}-cambricon-mlu-{i}", 49152) for i in range(2)]


def test_a_vendor_device_must_not_declare_mig() -> None:
    doc = {"nodes": {NODE: [{"uuid": "x", "vendor": "ascend", "model": "Ascend910B3", "memory_mib": 1, "mig": True}]}}
    with pytest.raises(InvalidInput, match="MIG is NVIDIA's"):
        decode_fake_inventory(yaml.safe_dump(doc), NODE)
