"""The virtual devices advertised for the node's GPUs (hami-protocol §5.2)."""

from __future__ import annotations

import pytest

from hami_allocator.inventory import MAX_DEVICE_ID, DeclaredInventory, Gpu, device_id, parse_declared, virtual_devices


def test_device_ids_are_uuid_dash_index_as_hami_names_them() -> None:
    devices = virtual_devices([Gpu("GPU-a"), Gpu("GPU-b", healthy=False)], 2)
    assert [(d.id, d.uuid, d.healthy) for d in devices] == [
        ("GPU-a-0", "GPU-a", True),
        ("GPU-a-1", "GPU-a", True),
        ("GPU-b-0", "GPU-b", False),
        ("GPU-b-1", "GPU-b", False),
    ]


def test_an_overlong_uuid_gets_short_stable_distinct_ids() -> None:
    uuid = "GPU-" + "f" * 80
    ids = [device_id(uuid, i) for i in range(12)]
    assert all(len(i) <= MAX_DEVICE_ID for i in ids)
    assert len(set(ids)) == len(ids)
    assert ids == [device_id(uuid, i) for i in range(12)]
    assert device_id("GPU-" + "e" * 80, 0) != ids[0]


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        pytest.param(["GPU-a", "GPU-b:1"], (Gpu("GPU-a"), Gpu("GPU-b", numa=1)), id="a NUMA node may follow a colon"),
        pytest.param([], (), id="nothing declared is no GPU"),
    ],
)
def test_declared_gpus_parse(entries: list[str], expected: tuple[Gpu, ...]) -> None:
    assert parse_declared(entries) == expected


@pytest.mark.parametrize("entries", [["GPU-a", "GPU-a"], [":1"], ["GPU-a:x"]])
def test_bad_declarations_are_refused(entries: list[str]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        parse_declared(entries)


async def test_only_a_real_change_moves_the_inventory_version() -> None:
    inventory = DeclaredInventory([Gpu("GPU-a")])
    await inventory.replace([Gpu("GPU-a")])
    assert inventory.snapshot().version == 1
    await inventory.set_health("GPU-a", False)
    changed = await inventory.wait_newer(1)
    assert (changed.version, changed.gpus) == (2, (Gpu("GPU-a", healthy=False),))
