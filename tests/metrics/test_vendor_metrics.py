"""A node whose devices come from several families is exposed per vendor (issue 20 item 7).

The node agent registers every family it serves in one :class:`NodeInventory` (hami-vendors §1.9, §2.8, §3.7:
HAMi has no vendor-specific scheduler metrics, its generic ``hami_gpu_*`` series carry each card's
``device_type`` and ``device_uuid``), so the aggregator needs nothing per vendor: these tests publish a mixed
inventory and placements on the real bus and read the scrape.
"""

from __future__ import annotations

from hami_common import subjects
from hami_common.annotations import DeviceInfo
from hami_common.events import ContainerPlacement, PlacedDevice

from .conftest import GPU_A, NODE, Served, inventory, labels, placement, series

NPU = "2b8d4f61-ascend-die-0"  # Ascend: the die id the plugin registers
MLU = f"{NODE}-cambricon-mlu-0"  # Cambricon: HAMi's invented id, <node>-cambricon-mlu-<i>
DCU = "DCU-1234567890"  # Hygon: DCU-<serial>
MIB = 1 << 20

MIXED = (
    DeviceInfo(id=GPU_A, index=0, count=10, devmem=81920, devcore=100, type="NVIDIA-A100", health=True),
    DeviceInfo(id=NPU, index=0, count=4, devmem=65536, devcore=20, type="Ascend910B3", health=True),
    DeviceInfo(id=MLU, index=0, count=100, devmem=49152, devcore=100, type="MLU", health=True),
    DeviceInfo(id=DCU, index=0, count=4, devmem=65520, devcore=100, type="DCU-K100_AI", health=True),
)


def card(uuid: str, device_type: str, **extra: str) -> frozenset[tuple[str, str]]:
    """A card's series labels: HAMi's, with the vGPU zone our exposition adds to every device series."""
    return labels(node=NODE, device_uuid=uuid, device_index="0", device_type=device_type, zone="vGPU", **extra)


def placed(uuid: str, vendor: str, mib: int, cores: int) -> ContainerPlacement:
    return ContainerPlacement(
        name="main", devices=(PlacedDevice(uuid=uuid, type=vendor, usedmem_mib=mib, usedcores=cores),)
    )


async def test_a_mixed_node_exposes_each_card_with_its_vendors_type(served: Served) -> None:
    await served.publish(subjects.inventory(NODE), inventory(devices=MIXED))
    limits = series(await served.scrape(), "hami_gpu_memory_limit_bytes")
    assert limits == {
        card(GPU_A, "NVIDIA-A100"): 81920 * MIB,
        card(NPU, "Ascend910B3"): 65536 * MIB,
        card(MLU, "MLU"): 49152 * MIB,
        card(DCU, "DCU-K100_AI"): 65520 * MIB,
    }


async def test_placements_on_other_vendors_cards_count_against_those_cards(served: Served) -> None:
    await served.publish(subjects.inventory(NODE), inventory(devices=MIXED))
    await served.publish(
        subjects.placement(NODE),
        placement("npu-pod", placed(NPU, "Ascend910B3", 16384, 0)),
        placement("mlu-pod", placed(MLU, "MLU", 5120, 10)),
        placement("dcu-pod", placed(DCU, "DCU", 2000, 60)),
    )
    samples = await served.scrape()
    allocated = series(samples, "hami_gpu_memory_allocated_bytes")
    assert allocated[card(NPU, "Ascend910B3", device_cores="20")] == 16384 * MIB
    assert allocated[card(MLU, "MLU", device_cores="100")] == 5120 * MIB
    cores = series(samples, "hami_gpu_core_allocated_ratio")
    assert cores[card(DCU, "DCU-K100_AI")] == 60
    assert cores[card(GPU_A, "NVIDIA-A100")] == 0
