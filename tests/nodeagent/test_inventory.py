"""Discovery: one interface, two backends chosen by name; the NVML ones skip where there is no GPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_common.errors import InvalidInput, TransientError
from hami_common.inventory import (
    FAKE,
    NVML,
    FakeInventory,
    Gpu,
    GpuInventory,
    GpuLink,
    NodeDeviceConfig,
    NvmlInventory,
    PcieLevel,
    apply_node_overrides,
    decode_fake_inventory,
    open_inventory,
    pair_scores,
)
from tests.nodeagent._nvml_double import Card, NvmlDouble
from tests.nodeagent.conftest import NODE, UUID_A, UUID_B, inventory_doc, write_inventory


def _nvml_or_skip() -> NvmlInventory:
    try:
        return NvmlInventory()
    except TransientError as err:
        pytest.skip(f"no NVIDIA driver or GPU on this machine: {err}")


NVML_DOUBLE = "nvml over a stand-in library"


def _double(sysfs: Path) -> tuple[NvmlDouble, Path]:
    """Two NVLinked GPUs on one CPU, one PCIe-only GPU on the other, and their sysfs NUMA files."""
    double = NvmlDouble(
        cards=[
            Card(UUID_A, "Tesla V100-SXM2-32GB", "00000000:3B:00.0", 32768, used_mib=1024, util=30,
                 nvlinks=["00000000:86:00.0"] * 2),
            Card(UUID_B, "Tesla V100-SXM2-32GB", "00000000:86:00.0", 32768, nvlinks=["00000000:3B:00.0"] * 2),
            Card("GPU-c", "NVIDIA A10", "00000001:AF:00.0", 24576),
        ],
        topology={(0, 1): 40, (1, 0): 40, (0, 2): 50, (2, 0): 50, (1, 2): 50, (2, 1): 50},
    )  # fmt: skip
    for bus, numa in (("0000:3b:00.0", "0"), ("0000:86:00.0", "1\n"), ("0001:af:00.0", "-1")):
        (sysfs / bus).mkdir(parents=True)
        (sysfs / bus / "numa_node").write_text(numa)
    return double, sysfs


@pytest.fixture(params=[FAKE, NVML, NVML_DOUBLE])
def backend(request: pytest.FixtureRequest, inventory_file: Path, tmp_path: Path) -> Iterator[GpuInventory]:
    inventory: GpuInventory
    if request.param == FAKE:
        inventory = FakeInventory(inventory_file, NODE)
    elif request.param == NVML:
        inventory = _nvml_or_skip()
    else:
        double, sysfs = _double(tmp_path / "sys")
        inventory = NvmlInventory(library=double, pci_devices=sysfs)
    yield inventory
    inventory.close()


def test_backend_reports_each_gpu_once_with_identity_and_size(backend: GpuInventory) -> None:
    gpus = backend.gpus()
    assert len({g.uuid for g in gpus}) == len(gpus)
    assert len({g.index for g in gpus}) == len(gpus)
    assert all(g.uuid and g.model and g.memory_mib >= 0 and g.numa >= 0 for g in gpus)
    assert backend.gpus() == gpus  # a second look at an unchanged node sees the same GPUs


def test_backend_host_figures_name_known_gpus(backend: GpuInventory) -> None:
    known = {g.uuid for g in backend.gpus()}
    stats = backend.stats()
    assert {s.uuid for s in stats} <= known
    assert all(s.memory_used_bytes >= 0 and 0 <= s.utilization_percent <= 100 for s in stats)


def test_backend_links_point_at_gpus_of_the_same_node(backend: GpuInventory) -> None:
    gpus = backend.gpus()
    known = {g.uuid for g in gpus}
    assert all(link.peer in known for g in gpus for link in g.links)
    report = pair_scores(gpus)
    assert set(report.scores) == known
    assert all(set(row) == known - {uuid} for uuid, row in report.scores.items())


def test_backend_names_its_kind(backend: GpuInventory) -> None:
    assert backend.kind in (FAKE, NVML)


def test_fake_inventory_reads_declared_gpus(inventory_file: Path) -> None:
    first, second = FakeInventory(inventory_file, NODE).gpus()
    assert (first.uuid, first.index, first.model, first.memory_mib, first.numa) == (
        UUID_A, 0, "Tesla V100-PCIE-32GB", 32768, 0,
    )  # fmt: skip
    assert (second.index, second.numa, second.healthy) == (1, 1, True)
    assert first.link_to(UUID_B) == GpuLink(peer=UUID_B, pcie=PcieLevel.SAME_CPU, nvlinks=2)


def test_fake_inventory_sees_a_health_change_on_the_next_look(inventory_file: Path) -> None:
    inventory = FakeInventory(inventory_file, NODE)
    assert all(g.healthy for g in inventory.gpus())
    write_inventory(inventory_file, inventory_doc(healthy_b=False))
    assert [g.healthy for g in inventory.gpus()] == [True, False]


def test_fake_inventory_declares_a_node_without_gpus(inventory_file: Path) -> None:
    assert FakeInventory(inventory_file, "cpu-node").gpus() == ()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        pytest.param("nodes: [", "fake inventory", id="yaml that does not parse"),
        pytest.param("gpus: []", "gpus", id="a file without nodes"),
        pytest.param("nodes: {other: []}", "not declared", id="a file that does not declare this node"),
        pytest.param(
            "nodes: {gpu-node-1: [{uuid: G, model: M, memory_mib: -1}]}", "non-negative", id="negative memory"
        ),
        pytest.param(
            "nodes: {gpu-node-1: [{uuid: G, model: M, memory_mib: 1, color: red}]}", "color", id="an unknown key"
        ),
        pytest.param(
            "nodes: {gpu-node-1: [{uuid: G, model: M, memory_mib: 1, links: [{peer: H, pcie: warp}]}]}",
            "warp",
            id="an unknown PCIe level",
        ),
        pytest.param(
            "nodes: {gpu-node-1: [{uuid: G, model: M, memory_mib: 1}, {uuid: G, model: M, memory_mib: 1}]}",
            "twice",
            id="a GPU listed twice",
        ),
        pytest.param(
            "nodes: {gpu-node-1: [{uuid: G, model: M, memory_mib: 1}, {uuid: H, index: 0, model: M, memory_mib: 1}]}",
            "twice",
            id="two GPUs with one index",
        ),
    ],
)
def test_fake_inventory_refuses_malformed_files(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InvalidInput, match=words):
        FakeInventory(path, NODE)


def test_missing_fake_inventory_file_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="fake inventory"):
        FakeInventory(tmp_path / "absent.yaml", NODE)


def test_backend_is_chosen_by_name_only(inventory_file: Path) -> None:
    assert open_inventory(FAKE, node=NODE, fake_file=inventory_file).kind == FAKE
    with pytest.raises(InvalidInput, match="unknown inventory kind"):
        open_inventory("auto", node=NODE, fake_file=inventory_file)
    with pytest.raises(InvalidInput, match="needs a file"):
        open_inventory(FAKE, node=NODE)


def test_nvml_without_a_driver_fails_instead_of_falling_back(inventory_file: Path) -> None:
    try:
        open_inventory(NVML, node=NODE, fake_file=inventory_file).close()
    except TransientError:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver: there is nothing to fall back from")
    with pytest.raises(TransientError, match="NVML"):
        open_inventory(NVML, node=NODE, fake_file=inventory_file)


def _gpu(uuid: str, *links: GpuLink) -> Gpu:
    return Gpu(uuid=uuid, index=0, model="M", memory_mib=1, links=links)


def test_pair_score_adds_pcie_level_and_a_hundred_per_nvlink() -> None:
    a = _gpu("A", GpuLink("B", PcieLevel.SAME_BOARD, 6), GpuLink("C", PcieLevel.CROSS_CPU))
    b = _gpu("B", GpuLink("A", PcieLevel.SAME_BOARD, 6))
    c = _gpu("C", GpuLink("A", PcieLevel.CROSS_CPU))
    report = pair_scores([a, b, c])
    assert report.scores == {"A": {"B": 660, "C": 10}, "B": {"A": 660, "C": 0}, "C": {"A": 10, "B": 0}}
    assert report.asymmetric == ()


def test_pair_with_different_link_counts_by_direction_scores_zero_and_is_reported() -> None:
    a = _gpu("A", GpuLink("B", PcieLevel.SAME_CPU, 2))
    b = _gpu("B", GpuLink("A", PcieLevel.SAME_CPU, 1))
    report = pair_scores([a, b])
    assert report.scores == {"A": {"B": 0}, "B": {"A": 0}}
    assert report.asymmetric == (("A", "B"),)


def test_node_overrides_apply_only_to_the_named_node() -> None:
    config = (
        '{"nodeconfig": [{"name": "other", "devicesplitcount": 3},'
        ' {"name": "gpu-node-1", "devicesplitcount": 4, "devicememoryscaling": 1.5, "devicecorescaling": 2,'
        ' "filterdevices": {"uuid": ["GPU-x"], "index": [3]}, "libcudaloglevel": 3}]}'
    )
    mine = apply_node_overrides(NodeDeviceConfig(), config, NODE)
    assert (mine.split_count, mine.memory_scaling, mine.core_scaling) == (4, 1.5, 2)
    assert (mine.filter_uuids, mine.filter_indices) == (frozenset({"GPU-x"}), frozenset({3}))
    assert apply_node_overrides(NodeDeviceConfig(split_count=7), config, "third") == NodeDeviceConfig(split_count=7)


@pytest.mark.parametrize(
    "config",
    [
        pytest.param("{", id="json that does not parse"),
        pytest.param('{"nodeconfig": [{"name": "gpu-node-1", "devicesplitcount": 0}]}', id="a zero split count"),
        pytest.param('{"nodeconfig": [{"name": "gpu-node-1", "operatingmode": "mps"}]}', id="an unknown mode"),
        pytest.param('{"nodeconfig": [{"name": "gpu-node-1", "migstrategy": "all"}]}', id="an unknown migstrategy"),
        pytest.param('{"nodeconfig": [{"name": "gpu-node-1", "devicesplitcount": "x"}]}', id="a string count"),
    ],
)
def test_node_overrides_refuse_what_cannot_be_registered(config: str) -> None:
    with pytest.raises(InvalidInput):
        apply_node_overrides(NodeDeviceConfig(), config, NODE)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_inventory_text_is_declared_gpus_or_invalid_input(text: str) -> None:
    try:
        gpus, stats = decode_fake_inventory(text, NODE)
    except InvalidInput:
        return
    assert len({g.uuid for g in gpus}) == len({g.index for g in gpus}) == len(gpus) == len(stats)


GPU_ENTRY = st.fixed_dictionaries(
    {"uuid": st.text(max_size=8), "model": st.text(max_size=8), "memory_mib": st.integers(-5, 10**6)},
    optional={
        "index": st.integers(-2, 8),
        "numa": st.integers(-2, 4),
        "healthy": st.booleans(),
        "links": st.lists(st.fixed_dictionaries({"peer": st.text(max_size=4), "nvlinks": st.integers(-1, 20)})),
        "used_mib": st.integers(-1, 10),
        "color": st.just("red"),
    },
)


@settings(max_examples=200, deadline=None)
@given(st.lists(GPU_ENTRY, max_size=4))
def test_any_declared_node_is_registered_sanely_or_refused(entries: list[dict[str, object]]) -> None:
    try:
        gpus, _ = decode_fake_inventory(yaml.safe_dump({"nodes": {NODE: entries}}), NODE)
    except InvalidInput:
        return
    assert all(g.uuid and g.memory_mib >= 0 and g.numa >= 0 and g.index >= 0 for g in gpus)
    assert all(link.nvlinks >= 0 for g in gpus for link in g.links)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=100), st.text(max_size=100)))
def test_any_node_config_bytes_are_overrides_or_invalid_input(raw: bytes | str) -> None:
    try:
        config = apply_node_overrides(NodeDeviceConfig(), raw, NODE)
    except InvalidInput:
        return
    assert config.split_count >= 1


def test_nvml_backend_maps_identity_numa_and_links(tmp_path: Path) -> None:
    double, sysfs = _double(tmp_path / "sys")
    a, b, c = NvmlInventory(library=double, pci_devices=sysfs).gpus()
    assert (a.uuid, a.index, a.model, a.memory_mib, a.numa, a.bus_id) == (
        UUID_A, 0, "Tesla V100-SXM2-32GB", 32768, 0, "00000000:3B:00.0",
    )  # fmt: skip
    assert (b.numa, c.numa) == (1, 0)  # "-1" in sysfs (no NUMA affinity) registers as 0
    assert a.link_to(UUID_B) == GpuLink(UUID_B, PcieLevel.SAME_CPU, 2)
    assert a.link_to("GPU-c") == GpuLink("GPU-c", PcieLevel.CROSS_CPU, 0)
    assert pair_scores([a, b, c]).scores[UUID_A] == {UUID_B: 220, "GPU-c": 10}


def test_nvml_backend_marks_a_gpu_unhealthy_for_good_after_a_critical_xid(tmp_path: Path) -> None:
    double, sysfs = _double(tmp_path / "sys")
    inventory = NvmlInventory(library=double, pci_devices=sysfs)
    double.xid(1, 13)  # an application fault: ignored, as HAMi ignores it
    assert [g.healthy for g in inventory.gpus()] == [True, True, True]
    double.xid(1, 79)  # fallen off the bus
    assert [g.healthy for g in inventory.gpus()] == [True, False, True]
    assert [g.healthy for g in inventory.gpus()] == [True, False, True]  # no recovery path


def test_nvml_backend_reports_a_lost_gpu_unhealthy_and_leaves_it_out_of_the_figures(tmp_path: Path) -> None:
    double, sysfs = _double(tmp_path / "sys")
    inventory = NvmlInventory(library=double, pci_devices=sysfs)
    seen = inventory.gpus()[2]
    double.cards[2].lost = True
    lost = inventory.gpus()[2]
    assert (lost.uuid, lost.memory_mib, lost.healthy) == (seen.uuid, seen.memory_mib, False)
    assert [s.uuid for s in inventory.stats()] == [UUID_A, UUID_B]
    assert inventory.stats()[0].memory_used_bytes == 1024 << 20


def test_nvml_backend_keeps_a_gpu_healthy_that_cannot_report_its_memory(tmp_path: Path) -> None:
    double, sysfs = _double(tmp_path / "sys")
    double.cards[0].memory_unsupported = True
    first = NvmlInventory(library=double, pci_devices=sysfs).gpus()[0]
    assert (first.memory_mib, first.healthy) == (0, True)  # registration then uses preConfiguredDeviceMemory


def test_nvml_backend_that_never_saw_a_gpu_answer_reports_discovery_failure(tmp_path: Path) -> None:
    double, sysfs = _double(tmp_path / "sys")
    double.cards[1].lost = True
    with pytest.raises(TransientError, match="NVML discovery failed"):
        NvmlInventory(library=double, pci_devices=sysfs).gpus()
