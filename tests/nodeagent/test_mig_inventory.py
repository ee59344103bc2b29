"""MIG on the node: the profile tables, the fake and NVML MIG backends, node config and registration."""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec
import pytest

from hami_common.annotations import encode_node_devices
from hami_common.annotations.registration import MigPlacement, MigProfile
from hami_common.deviceconfig import read_device_config
from hami_common.errors import InvalidInput, TransientError
from hami_common.inventory import (
    MIG_CARDS,
    MODE_MIG,
    FakeInventory,
    Gpu,
    MigAllowlist,
    MigCard,
    MigControl,
    MigInstance,
    MigNotPermitted,
    MigRefused,
    NodeDeviceConfig,
    NvmlInventory,
    NvmlMigControl,
    allowed_mig_profiles,
    apply_node_overrides,
    instance_count,
    mig_card,
    open_mig_control,
)
from hami_nodeagent.registration import register_devices
from tests.nodeagent._nvml_double import Card, NvmlDouble
from tests.nodeagent.conftest import NODE, UUID_A, UUID_B, write_inventory

CHART = Path(__file__).parents[1] / "common" / "fixtures" / "hami-device-config.yaml"
MIG_NODE = NodeDeviceConfig(mode=MODE_MIG)
A100_80 = "NVIDIA A100-SXM4-80GB"
# HAMi's compact MIG profile form (hami-protocol §11 row 5): A100-40GB's 1g.5gb at its last placement
SPEC_PROFILE = '{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,"placements":[{"start":6,"size":1}]}'


def _names(profiles: tuple[MigProfile, ...]) -> list[str]:
    return [p.name for p in profiles]


def _mig_gpu(uuid: str = UUID_A, model: str = A100_80, index: int = 0) -> Gpu:
    card = mig_card(model)
    assert card is not None
    return Gpu(uuid=uuid, index=index, model=model, memory_mib=81920, mig_profiles=card.hami_profiles())


# --- the tables ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("card", MIG_CARDS, ids=[c.key for c in MIG_CARDS])
def test_every_table_is_a_card_a_driver_could_have(card: MigCard) -> None:
    memory_slices = 8 if card.compute_slices == 7 else 4
    for spec in card.profiles:
        # NVML's instance count is how many of its placements fit side by side
        assert instance_count(spec.placements) == spec.instances, spec.name
        assert all(p.start + p.size <= memory_slices for p in spec.placements), spec.name
        assert spec.name.startswith(f"{spec.slices}g.")
    whole = card.profiles[-1]
    assert (whole.slices, whole.instances, whole.placements) == (
        card.compute_slices,
        1,
        (MigPlacement(start=0, size=memory_slices),),
    )
    assert [p.core for p in card.hami_profiles()][-1] == 100
    assert len({p.name for p in card.profiles}) == len(card.profiles)


def test_a100_40gb_1g_5gb_is_hamis_example_profile() -> None:
    card = mig_card("NVIDIA A100-SXM4-40GB")
    assert card is not None
    one = card.hami_profiles()[0]
    assert MigPlacement(start=6, size=1) in one.placements
    only_last = msgspec.structs.replace(one, placements=(MigPlacement(start=6, size=1),))
    assert msgspec.json.encode(only_last).decode() == SPEC_PROFILE


@pytest.mark.parametrize(
    ("model", "key"),
    [
        pytest.param("NVIDIA A100-SXM4-80GB", "A100-80GB", id="A100 SXM 80GB"),
        pytest.param("NVIDIA A100 80GB PCIe", "A100-80GB", id="A100 PCIe 80GB"),
        pytest.param("NVIDIA A100-PCIE-40GB", "A100-40GB", id="A100 PCIe 40GB"),
        pytest.param("NVIDIA H100 80GB HBM3", "H100-80GB", id="H100 SXM"),
        pytest.param("NVIDIA H100 PCIe", "H100-80GB", id="H100 PCIe shares the table"),
        pytest.param("NVIDIA H200", "H200-141GB", id="H200 is not an H20"),
        pytest.param("NVIDIA H20", "H20", id="H20"),
        pytest.param("NVIDIA A30", "A30-24GB", id="A30"),
        pytest.param("NVIDIA B200", "B200", id="B200"),
        pytest.param("Tesla V100-PCIE-32GB", None, id="a card without MIG"),
        pytest.param("NVIDIA A10", None, id="A10 is not an A100"),
    ],
)
def test_a_model_selects_its_table_by_whole_words(model: str, key: str | None) -> None:
    card = mig_card(model)
    assert (card.key if card else None) == key


# --- the allowlist, one function for node agent and allocator ---------------------------------------------------


def test_the_charts_allowlist_restricts_each_model_to_its_own_entry() -> None:
    allowlist = read_device_config(CHART).mig_profile_allowlist
    a100 = _mig_gpu(model="NVIDIA A100-SXM4-40GB")
    assert _names(allowed_mig_profiles(allowlist, a100.model, a100.mig_profiles)) == [
        "1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb",
    ]  # fmt: skip
    h200 = _mig_gpu(model="NVIDIA H200 NVL")  # the chart lists H20 first: a substring match would take that
    assert _names(allowed_mig_profiles(allowlist, h200.model, h200.mig_profiles)) == [
        "1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb",
    ]  # fmt: skip


def test_a_model_the_allowlist_does_not_name_keeps_every_profile() -> None:
    gpu = _mig_gpu()
    allowlist = (MigAllowlist(models=("A30",), profiles=("1g.6gb",)),)
    assert allowed_mig_profiles(allowlist, gpu.model, gpu.mig_profiles) == gpu.mig_profiles


def test_node_config_gives_profiles_only_on_a_mig_node_and_through_the_allowlist() -> None:
    gpu = _mig_gpu()
    allow = (MigAllowlist(models=("A100-SXM4-80GB",), profiles=("3g.40gb", "2g.20gb")),)
    assert NodeDeviceConfig(mig_allowlist=allow).mig_profiles(gpu) == ()
    assert _names(NodeDeviceConfig(mode=MODE_MIG, mig_allowlist=allow).mig_profiles(gpu)) == ["2g.20gb", "3g.40gb"]


@pytest.mark.parametrize("strategy", ["none", "single", "mixed"])
def test_a_node_entry_turns_mig_mode_on_with_any_strategy(strategy: str) -> None:
    config = apply_node_overrides(
        NodeDeviceConfig(),
        f'{{"nodeconfig": [{{"name": "{NODE}", "operatingmode": "mig", "migstrategy": "{strategy}"}}]}}',
        NODE,
    )
    assert (config.mode, config.mig_strategy) == ("mig", strategy)


def test_an_allowlist_entry_without_models_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text("nvidia:\n  migProfileAllowlist:\n  - profiles: [1g.10gb]\n")
    with pytest.raises(InvalidInput, match=r"migProfileAllowlist\[0\]"):
        read_device_config(path)


# --- registration ----------------------------------------------------------------------------------------------


def _profile_json(name: str, memory: int, core: int, slices: int, starts: tuple[int, ...], size: int) -> str:
    placements = ",".join(f'{{"start":{s},"size":{size}}}' for s in starts)
    return f'{{"name":"{name}","memoryMB":{memory},"core":{core},"sliceCount":{slices},"placements":[{placements}]}}'


def test_a_mig_gpu_registers_as_hami_does() -> None:
    allow = (MigAllowlist(models=("A100-SXM4-80GB",), profiles=("1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb")),)
    config = NodeDeviceConfig(mode=MODE_MIG, mig_allowlist=allow, memory_scaling=2.0, core_scaling=3.0)
    gpu = Gpu(uuid=UUID_B, index=1, model=A100_80, memory_mib=81920, numa=1, mig_profiles=_mig_gpu().mig_profiles)
    expected = (
        f'[{{"id":"{UUID_B}","index":1,"count":7,"devmem":81920,"devcore":100,"type":"NVIDIA A100-SXM4-80GB",'
        f'"numa":1,"mode":"mig","migProfiles":['
        + ",".join(
            (
                _profile_json("1g.10gb", 9728, 15, 1, (0, 1, 2, 3, 4, 5, 6), 1),
                _profile_json("2g.20gb", 19968, 29, 2, (0, 2, 4), 2),
                _profile_json("3g.40gb", 40192, 43, 3, (0, 4), 4),
                _profile_json("7g.79gb", 80896, 100, 7, (0,), 8),
            )
        )
        + '],"health":true}]'
    )
    assert encode_node_devices(register_devices([gpu], config)) == expected


def test_count_is_the_most_instances_an_allowed_profile_fits() -> None:
    allow = (MigAllowlist(models=("A100",), profiles=("2g.20gb", "7g.79gb")),)
    (device,) = register_devices([_mig_gpu()], NodeDeviceConfig(mode=MODE_MIG, mig_allowlist=allow))
    assert (device.count, _names(device.mig_profiles)) == (3, ["2g.20gb", "7g.79gb"])


def test_on_a_mig_node_a_gpu_without_mig_is_shared_in_slots_and_elsewhere_mig_gpus_are_too() -> None:
    v100 = Gpu(uuid=UUID_B, index=1, model="Tesla V100-PCIE-32GB", memory_mib=32768)
    mig, plain = register_devices([_mig_gpu(), v100], MIG_NODE)
    assert (mig.mode, plain.mode, plain.count, plain.mig_profiles) == ("mig", "hami-core", 10, ())
    (on_core_node,) = register_devices([_mig_gpu()], NodeDeviceConfig())
    assert (on_core_node.mode, on_core_node.mig_profiles) == ("hami-core", ())


# --- the fake inventory and its MIG driver -------------------------------------------------------------------


def _mig_inventory(tmp_path: Path) -> Path:
    doc = {
        "nodes": {
            NODE: [
                {"uuid": UUID_A, "model": A100_80, "memory_mib": 81920, "mig": True},
                {"uuid": UUID_B, "index": 1, "model": A100_80, "memory_mib": 81920},
            ]
        }
    }
    return write_inventory(tmp_path / "inventory.yaml", doc)


def test_a_fake_gpu_in_mig_mode_offers_its_models_table(tmp_path: Path) -> None:
    mig, plain = FakeInventory(_mig_inventory(tmp_path), NODE).gpus()
    card = mig_card(A100_80)
    assert card is not None
    assert (mig.mig_profiles, plain.mig_profiles) == (card.hami_profiles(), ())


def test_a_fake_gpu_declaring_mig_on_a_model_without_it_is_refused(tmp_path: Path) -> None:
    doc = {"nodes": {NODE: [{"uuid": UUID_A, "model": "Tesla T4", "memory_mib": 15360, "mig": True}]}}
    with pytest.raises(InvalidInput, match=rf"{UUID_A}.*'Tesla T4'"):
        FakeInventory(write_inventory(tmp_path / "inventory.yaml", doc), NODE)


def _fake(tmp_path: Path) -> MigControl:
    return open_mig_control(
        "fake", node=NODE, fake_file=_mig_inventory(tmp_path), state_file=tmp_path / "mig-state.json"
    )


def test_the_fake_driver_creates_at_placements_and_refuses_overlaps(tmp_path: Path) -> None:
    mig = _fake(tmp_path)
    first = mig.create(UUID_A, "1g.10gb", MigPlacement(start=0, size=1))
    second = mig.create(UUID_A, "1g.10gb", MigPlacement(start=4, size=1))
    assert (first.gpu_instance_id, second.gpu_instance_id, first.compute_instance_id) == (1, 2, 0)
    assert first.mig_uuid.startswith("MIG-")
    assert first.mig_uuid != second.mig_uuid
    # fragmentation: with instances at 0 and 4 neither 4-slice placement is free
    for start in (0, 4):
        with pytest.raises(MigRefused, match="overlaps"):
            mig.create(UUID_A, "3g.40gb", MigPlacement(start=start, size=4))
    assert mig.create(UUID_A, "1g.10gb", MigPlacement(start=0, size=1)) == first
    mig.destroy(UUID_A, first.gpu_instance_id)
    mig.destroy(UUID_A, 99)
    assert mig.instances() == (second,)
    third = mig.create(UUID_A, "2g.20gb", MigPlacement(start=0, size=2))
    assert third.gpu_instance_id == 1  # the lowest free id, as the driver reuses it


@pytest.mark.parametrize(
    ("gpu", "profile", "placement", "why"),
    [
        pytest.param(UUID_B, "1g.10gb", (0, 1), "not in MIG mode", id="a GPU not in MIG mode"),
        pytest.param("GPU-nowhere", "1g.10gb", (0, 1), "not on node", id="a GPU of another node"),
        pytest.param(UUID_A, "1g.5gb", (0, 1), "no MIG profile", id="a profile of another card"),
        pytest.param(UUID_A, "3g.40gb", (2, 4), "cannot be placed", id="a placement the profile does not offer"),
        pytest.param(UUID_A, "7g.79gb", (0, 7), "cannot be placed", id="a size the profile does not have"),
    ],
)
def test_the_fake_driver_refuses_what_a_gpu_refuses(
    tmp_path: Path, gpu: str, profile: str, placement: tuple[int, int], why: str
) -> None:
    mig = _fake(tmp_path)
    with pytest.raises(MigRefused, match=why):
        mig.create(gpu, profile, MigPlacement(start=placement[0], size=placement[1]))
    assert mig.instances() == ()


def test_the_node_processes_share_the_fake_drivers_instances(tmp_path: Path) -> None:
    inventory = _mig_inventory(tmp_path)
    agent = open_mig_control("fake", node=NODE, fake_file=inventory)
    allocator = open_mig_control("fake", node=NODE, fake_file=str(inventory))
    try:
        made = allocator.create(UUID_A, "7g.79gb", MigPlacement(start=0, size=8))
        assert agent.instances(UUID_A) == (made,)
        with pytest.raises(MigRefused):
            agent.create(UUID_A, "1g.10gb", MigPlacement(start=3, size=1))
    finally:
        agent.destroy(UUID_A, made.gpu_instance_id)
    assert allocator.instances() == ()


def test_racing_creates_of_overlapping_placements_leave_one_instance(tmp_path: Path) -> None:
    inventory, state = _mig_inventory(tmp_path), tmp_path / "mig-state.json"
    # every placement holds slice 0, so any two overlap and exactly one create may win
    wanted = [("7g.79gb", 0, 8), ("4g.40gb", 0, 4), ("3g.40gb", 0, 4), ("2g.20gb", 0, 2), ("1g.20gb", 0, 2)] * 4
    results: list[MigInstance | MigRefused] = []

    def create(profile: str, start: int, size: int) -> None:
        control = open_mig_control("fake", node=NODE, fake_file=inventory, state_file=state)  # its own lock fd
        try:
            results.append(control.create(UUID_A, profile, MigPlacement(start=start, size=size)))
        except MigRefused as err:
            results.append(err)

    threads = [threading.Thread(target=create, args=w) for w in wanted]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    instances = open_mig_control("fake", node=NODE, fake_file=inventory, state_file=state).instances()
    assert len(instances) == 1
    assert {r for r in results if not isinstance(r, MigRefused)} == set(instances)


@pytest.mark.parametrize(
    ("kind", "fake_file", "named"),
    [
        pytest.param("fake", "", "needs a file", id="a fake inventory without its file"),
        pytest.param("dcgm", "x", "unknown inventory kind", id="an unknown backend"),
    ],
)
def test_opening_a_mig_backend_wrongly_says_why(kind: str, fake_file: str, named: str) -> None:
    with pytest.raises(InvalidInput, match=named):
        open_mig_control(kind, node=NODE, fake_file=fake_file)


# --- NVML, over the stand-in library -------------------------------------------------------------------------


def _double() -> NvmlDouble:
    return NvmlDouble(
        [
            Card(UUID_A, A100_80, "00000000:3B:00.0", 81920, mig=True),
            Card(UUID_B, "Tesla V100-SXM2-32GB", "00000000:86:00.0", 32768),
            Card("GPU-c", "NVIDIA A30", "00000000:AF:00.0", 24576),  # MIG-capable, MIG mode off
        ]
    )


def test_nvml_reports_the_same_profiles_as_the_fake_inventory(tmp_path: Path) -> None:
    double = _double()
    nvml = NvmlMigControl(library=double)
    fake = FakeInventory(_mig_inventory(tmp_path), NODE).gpus()[0]
    assert nvml.profiles(UUID_A) == fake.mig_profiles
    assert nvml.profiles(UUID_B) == nvml.profiles("GPU-c") == nvml.profiles("GPU-gone") == ()
    gpus = NvmlInventory(library=double, pci_devices=tmp_path).gpus()
    assert [g.mig for g in gpus] == [True, False, False]
    with_nvml = register_devices(gpus[:1], MIG_NODE)
    with_fake = register_devices([Gpu(uuid=UUID_A, index=0, model=A100_80, memory_mib=81920,
                                      mig_profiles=fake.mig_profiles)], MIG_NODE)  # fmt: skip
    assert encode_node_devices(with_nvml) == encode_node_devices(with_fake)


def test_nvml_creates_lists_and_destroys_instances() -> None:
    double = _double()
    nvml = NvmlMigControl(library=double)
    made = nvml.create(UUID_A, "3g.40gb", MigPlacement(start=4, size=4))
    assert (made.gpu_instance_id, made.compute_instance_id, made.profile) == (1, 0, "3g.40gb")
    assert made.mig_uuid == double.cards[0].instances[1].mig_uuid != ""
    assert nvml.create(UUID_A, "3g.40gb", MigPlacement(start=4, size=4)) == made
    assert nvml.instances() == nvml.instances(UUID_A) == (made,)
    with pytest.raises(MigRefused, match=r"create 1g\.10gb at 5:1"):  # the driver's overlap refusal
        nvml.create(UUID_A, "1g.10gb", MigPlacement(start=5, size=1))
    double.calls.clear()
    nvml.destroy(UUID_A, made.gpu_instance_id)
    assert double.calls == ["destroy-ci", "destroy-gi"]  # a GPU instance goes after its compute instance
    nvml.destroy(UUID_A, made.gpu_instance_id)  # gone already: no error
    assert nvml.instances() == ()
    assert nvml.create(UUID_A, "4g.40gb", MigPlacement(start=0, size=4)).gpu_instance_id == 1  # space freed


@pytest.mark.parametrize(
    ("gpu", "profile", "placement"),
    [
        pytest.param(UUID_B, "1g.10gb", (0, 1), id="a GPU without MIG"),
        pytest.param("GPU-c", "1g.6gb", (0, 1), id="a GPU whose MIG mode is off"),
        pytest.param(UUID_A, "1g.6gb", (0, 1), id="a profile the GPU does not offer"),
        pytest.param(UUID_A, "2g.20gb", (1, 2), id="a placement the profile does not offer"),
    ],
)
def test_nvml_refusals_are_mig_refused_and_create_nothing(gpu: str, profile: str, placement: tuple[int, int]) -> None:
    double = _double()
    nvml = NvmlMigControl(library=double)
    with pytest.raises(MigRefused):
        nvml.create(gpu, profile, MigPlacement(start=placement[0], size=placement[1]))
    assert nvml.instances() == ()
    assert "create-gi" not in double.calls


def test_a_create_cut_short_leaves_no_gpu_instance_behind() -> None:
    double = _double()
    nvml = NvmlMigControl(library=double)
    double.fail_compute_instance = True
    with pytest.raises(Exception, match="NVML"):
        nvml.create(UUID_A, "7g.79gb", MigPlacement(start=0, size=8))
    assert double.cards[0].instances == {}
    assert nvml.create(UUID_A, "7g.79gb", MigPlacement(start=0, size=8)).mig_uuid


def test_a_gpu_instance_left_without_compute_instance_is_listed_for_reclaim() -> None:
    double = _double()
    nvml = NvmlMigControl(library=double)
    made = nvml.create(UUID_A, "2g.20gb", MigPlacement(start=2, size=2))
    double.nvmlComputeInstanceDestroy((0 << 8) | made.gpu_instance_id)  # a restart between the two creates
    (left,) = nvml.instances(UUID_A)
    assert (left.gpu_instance_id, left.compute_instance_id, left.mig_uuid) == (made.gpu_instance_id, -1, "")
    nvml.destroy(UUID_A, left.gpu_instance_id)
    assert double.cards[0].instances == {}


def test_nvml_without_mig_privileges_says_what_the_allocator_lacks_and_is_not_transient() -> None:
    double = _double()
    double.mig_config_permitted = False
    nvml = NvmlMigControl(library=double)
    assert nvml.profiles(UUID_A)  # reading needs no privilege: the node still registers its profiles
    with pytest.raises(MigNotPermitted) as refused:
        nvml.create(UUID_A, "3g.40gb", MigPlacement(start=4, size=4))
    assert not isinstance(refused.value, TransientError)
    assert isinstance(refused.value, MigRefused)  # callers that stop on a refusal stop on this one too
    message = str(refused.value)
    assert "CAP_SYS_ADMIN" in message
    assert "NVIDIA_MIG_CONFIG_DEVICES" in message
    assert double.cards[0].instances == {}
    double.mig_config_permitted = True
    made = nvml.create(UUID_A, "3g.40gb", MigPlacement(start=4, size=4))
    double.mig_config_permitted = False
    with pytest.raises(MigNotPermitted, match="CAP_SYS_ADMIN"):
        nvml.destroy(UUID_A, made.gpu_instance_id)
