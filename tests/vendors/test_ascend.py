"""Huawei Ascend as a device family: HAMi's upstream cases (hami-vendors §1.8, A1-A12) and our own edges."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from hami_common.annotations.devices import ContainerDevice, decode_pod_devices
from hami_common.annotations.keys import NODE_LOCK, VGPU_TIME
from hami_common.errors import AnnotationError, InvalidInput
from hami_common.resources import ContainerResources, DeviceRequest
from hami_common.scheduling.placement import fit_container
from hami_common.scheduling.policy import preferences_from_annotations
from hami_common.scheduling.reason import Reason, render_reasons
from hami_common.scheduling.usage import DeviceUsage, NodeUsage
from hami_common.scheduling.vendor import ContainerFit, FitContext, Vendor
from hami_common.vendors._common import allocatable_count, handshake_verdict
from hami_common.vendors._family import DeviceFamily, NodeView
from hami_common.vendors.ascend import CHART_CHIPS, AscendConfig, AscendFamily, ChipConfig, Template, families
from hami_common.vendors.ascend import keys as k
from hami_common.vendors.ascend.config import parse_vnpus
from hami_common.vendors.ascend.register import RegisteredNpu, decode_register, encode_register, plugin_network_id

CHIPS = {c.common_word: c for c in CHART_CHIPS}
A910A, B3, B4, B4_1, P310, C910 = (
    CHIPS[w] for w in ("Ascend910A", "Ascend910B3", "Ascend910B4", "Ascend910B4-1", "Ascend310P", "Ascend910C")
)
HAMI_CORE = {k.VNPU_MODE: k.MODE_HAMI_CORE}


def fam(chip: ChipConfig, **kw: Any) -> AscendFamily:
    return AscendFamily(chip=replace(chip, **kw) if kw else chip)


def ctr(limits: Mapping[str, str] | None = None, requests: Mapping[str, str] | None = None) -> ContainerResources:
    return ContainerResources(name="c", limits=dict(limits or {}), requests=dict(requests or {}))


def res(chip: ChipConfig, count: str | None = None, mem: str | None = None, core: str | None = None) -> dict[str, str]:
    out = {}
    for name, text in ((chip.resource_name, count), (chip.resource_memory_name, mem), (chip.resource_core_name, core)):
        if text is not None:
            out[name] = text
    return out


def npu(id: str, word: str = "Ascend910B3", **kw: Any) -> DeviceUsage:
    fields: dict[str, Any] = {
        "index": 0,
        "count": 4,
        "totalmem": 65536,
        "totalcore": 20,
        "type": word,
        "health": True,
        "mode": k.MODE_TEMPLATE,
    }
    fields.update(kw)
    return DeviceUsage(id=id, **fields)


def fit_ctx(family: AscendFamily, devices: tuple[DeviceUsage, ...], annotations: Mapping[str, str] = {}) -> FitContext:
    prefs = family.preferences(preferences_from_annotations(annotations, "default"), annotations)
    return FitContext(prefs=prefs, node=NodeUsage(name="n", devices=devices))


def fit(
    family: AscendFamily, devices: tuple[DeviceUsage, ...], req: DeviceRequest, annotations: Mapping[str, str] = {}
) -> ContainerFit:
    return family.fit(devices, req, fit_ctx(family, devices, annotations))


def req(word: str, nums: int = 1, mem: int = 0, cores: int = 0) -> DeviceRequest:
    return DeviceRequest(nums=nums, memreq=mem, mem_percentage=100 if mem == 0 else 0, coresreq=cores, type=word)


def uuids(result: ContainerFit) -> list[str]:
    return [d.uuid for d in result.devices]


# --- the port -------------------------------------------------------------------------------------------------


def test_family_satisfies_the_port_and_the_engine_vendor() -> None:
    family: DeviceFamily = fam(B3)
    vendor: Vendor = family
    assert vendor.word == "Ascend910B3"
    assert family.resource_names == (
        "huawei.com/Ascend910B3",
        "huawei.com/Ascend910B3-memory",
        "huawei.com/Ascend910B3-core",
    )
    assert family.handshake_key == "hami.io/node-handshake-Ascend910B3"
    assert family.node_lock.key == NODE_LOCK
    assert family.node_lock.shared


def test_a_chip_without_a_core_resource_lists_two_names() -> None:
    assert fam(B3, resource_core_name="").resource_names == ("huawei.com/Ascend910B3", "huawei.com/Ascend910B3-memory")


# --- config ---------------------------------------------------------------------------------------------------


def test_ascend_is_off_by_default_as_hami_needs_enable_ascend() -> None:
    assert families(AscendConfig()) == ()
    assert families(parse_vnpus(None)) == ()
    assert families(parse_vnpus({"hamiVnpuCore": True})) == ()


def test_enabled_section_gives_the_charts_seven_models_each_its_own_family() -> None:
    got = families(parse_vnpus({"enabled": True}))
    assert [f.word for f in got] == [
        "Ascend910A",
        "Ascend910B2",
        "Ascend910B3",
        "Ascend910B4-1",
        "Ascend910B4",
        "Ascend310P",
        "Ascend910C",
    ]
    assert [f.chip.super_pod for f in got] == [False] * 6 + [True]
    assert (P310.memory_allocatable, P310.memory_capacity) == (21527, 24576)


def test_hami_vnpu_core_default_reaches_every_family() -> None:
    assert all(f.hami_vnpu_core for f in families(parse_vnpus({"enabled": True, "hamiVnpuCore": True})))


def test_section_decodes_hamis_yaml_keys_and_sorts_templates_by_memory() -> None:
    raw = {
        "enabled": True,
        "configs": [
            {
                "chipName": "910B3",
                "commonWord": "Ascend910B3",
                "resourceName": "huawei.com/Ascend910B3",
                "resourceMemoryName": "huawei.com/Ascend910B3-memory",
                "memoryAllocatable": 65536,
                "memoryCapacity": 65536,
                "aiCore": 20,
                "aiCPU": 7,
                "templates": [{"name": "big", "memory": 32768, "aiCore": 10}, {"name": "small", "memory": 16384}],
            }
        ],
    }
    (family,) = families(parse_vnpus(raw))
    assert [t.name for t in family.chip.templates_by_memory] == ["small", "big"]
    assert family.chip.resource_core_name == ""


MINIMAL_CHIP = {"commonWord": "A", "resourceName": "h.com/A", "resourceMemoryName": "h.com/A-m"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param({"configs": [{"commonWord": "X", "memoryCapcity": 1}]}, "memoryCapcity", id="a typo is named"),
        pytest.param({"configs": [{"resourceName": "a/b"}]}, "commonWord", id="a chip needs a common word"),
        pytest.param(
            {"configs": [{"commonWord": "Ascend910B3", "resourceName": "nope"}]}, "resourceName", id="bad name"
        ),
        pytest.param({"configs": [MINIMAL_CHIP, MINIMAL_CHIP]}, "twice", id="two chips share a word"),
        pytest.param(
            {"configs": [{**MINIMAL_CHIP, "templates": [{"name": "t", "memory": 0}]}]},
            "templates[0]",
            id="empty template",
        ),
        pytest.param({"enabled": "yes"}, "enabled", id="a flag must be a bool"),
    ],
)
def test_bad_section_is_refused_naming_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message.replace("[", r"\[")):
        parse_vnpus(raw)


# --- webhook (A1-A5, §1.3 tables) -------------------------------------------------------------------------------


def test_a1_two_npus_of_a_template_size_are_refused_as_multi_device_vnpu() -> None:
    with pytest.raises(InvalidInput, match=r"^vNPU not supported for multiple devices$"):
        fam(A910A).admit(ctr(res(A910A, "2", "8738")), {})


def test_a1_memory_above_capacity_is_invalid() -> None:
    with pytest.raises(InvalidInput, match=r"^huawei\.com/Ascend910A-memory 40000 is invalid$"):
        fam(A910A).admit(ctr(res(A910A, "2", "40000")), {})


def test_a1_memory_past_every_template_takes_the_whole_card() -> None:
    got = fam(A910A).admit(ctr(res(A910A, "1", "20000"), res(A910A, mem="20000")), {})
    assert got.asks
    assert got.limits[A910A.resource_memory_name] == got.requests[A910A.resource_memory_name] == "32768"


@pytest.mark.parametrize(
    ("asked", "want"),
    [pytest.param("1", "2", id="one NPU becomes its whole module"), pytest.param("4", "4", id="an even count stays")],
)
def test_a2_910c_superpod_counts(asked: str, want: str) -> None:
    got = fam(C910).admit(ctr(res(C910, asked), res(C910, asked)), {})
    assert got.limits[C910.resource_name] == got.requests[C910.resource_name] == want


def test_a2_910c_superpod_refuses_an_odd_count() -> None:
    with pytest.raises(InvalidInput, match=r"^Ascend910C device request must be 1 or 2\*n, got 3$"):
        fam(C910).admit(ctr(res(C910, "3"), res(C910, "3")), {})


def test_a2_910c_module_rewrite_creates_no_request_the_user_left_out() -> None:
    got = fam(C910).admit(ctr(res(C910, "1")), {})
    assert got.limits[C910.resource_name] == "2"
    assert C910.resource_name not in got.requests


def test_910c_one_npu_with_a_template_is_not_a_multi_device_request() -> None:
    # The multi-device rule reads the count the user wrote (1), not the module rewrite (2).
    got = fam(C910).admit(ctr(res(C910, "1", "16384")), {})
    assert got.limits[C910.resource_name] == "2"
    assert got.limits[C910.resource_memory_name] == "16384"


def test_a3_910c_without_superpod_keeps_counts() -> None:
    family = fam(C910, super_pod=False)
    one = family.admit(ctr(res(C910, "1", "16384")), {})
    assert one.limits[C910.resource_name] == "1"
    assert one.limits[C910.resource_memory_name] == "16384"
    assert family.admit(ctr(res(C910, "3")), {}).limits[C910.resource_name] == "3"


# Upstream's A4 chip: 910B3 names, templates vir08/vir16, 32768 MiB.
A4_CHIP = replace(
    B3,
    memory_allocatable=32768,
    memory_capacity=32768,
    templates=(Template(name="vir08", memory=8738, ai_core=8), Template(name="vir16", memory=17476, ai_core=16)),
)


@pytest.mark.parametrize(
    ("core", "annotations", "refused"),
    [
        pytest.param("10", {}, True, id="hard split with core is refused"),
        pytest.param("25", {}, True, id="hard split with core over the chip is refused"),
        pytest.param("0", {}, False, id="hard split with core 0 is allowed"),
        pytest.param(None, {}, False, id="hard split without core is allowed"),
        pytest.param("10", HAMI_CORE, False, id="hami-core soft split with core is allowed"),
        pytest.param("10", {k.VNPU_MODE: "Hami-Core"}, True, id="the mode must be exactly hami-core"),
    ],
)
def test_a4_core_share_only_in_hami_core_mode(core: str | None, annotations: dict[str, str], refused: bool) -> None:
    c = ctr(res(A4_CHIP, "1", "8738", core), res(A4_CHIP, "1", "8738", core))
    if refused:
        with pytest.raises(InvalidInput, match=r"^huawei\.com/Ascend910B3-core is only supported in hami-core"):
            fam(A4_CHIP).admit(c, annotations)
    else:
        assert fam(A4_CHIP).admit(c, annotations).asks


def test_a4_core_in_requests_alone_is_refused_too() -> None:
    with pytest.raises(InvalidInput, match="hami-core"):
        fam(A4_CHIP).admit(ctr(res(A4_CHIP, "1"), res(A4_CHIP, core="5")), {})


def test_a5_hami_core_keeps_raw_memory_and_core() -> None:
    chip = replace(B3, memory_allocatable=32768, templates=())
    got = fam(chip).admit(ctr(res(B3, "1", "15360", "20"), res(B3, "1", "15360", "20")), HAMI_CORE)
    assert got.limits[B3.resource_memory_name] == "15360"
    assert got.limits[B3.resource_core_name] == "20"


def test_a5_hard_split_without_templates_falls_back_to_the_whole_card() -> None:
    chip = replace(B3, memory_allocatable=32768, memory_capacity=32768, templates=())
    got = fam(chip).admit(ctr(res(B3, "1", "15360")), {})
    assert got.limits[B3.resource_memory_name] == got.requests[B3.resource_memory_name] == "32768"


@pytest.mark.parametrize(
    ("chip", "asked", "want"),
    [
        pytest.param(B3, "2000", "16384", id="910B3 2000 -> vir05_1c_16g"),
        pytest.param(B3, "20000", "32768", id="910B3 20000 -> vir10_3c_32g"),
        pytest.param(B3, "40000", "65536", id="910B3 40000 -> whole card"),
        pytest.param(B3, "16384", "16384", id="910B3 exactly a template stays"),
        pytest.param(P310, "13000", "21527", id="310P 13000 -> whole card's allocatable"),
        pytest.param(P310, "5000", "6144", id="310P 5000 -> vir02"),
    ],
)
def test_hard_split_memory_rounds_up_to_a_template(chip: ChipConfig, asked: str, want: str) -> None:
    got = fam(chip).admit(ctr(res(chip, "1", asked)), {})
    assert got.limits[chip.resource_memory_name] == got.requests[chip.resource_memory_name] == want


@pytest.mark.parametrize(
    ("chip", "asked"), [pytest.param(B3, "70000", id="910B3 70000"), pytest.param(P310, "25000", id="310P 25000")]
)
def test_hard_split_memory_beyond_capacity_is_refused(chip: ChipConfig, asked: str) -> None:
    with pytest.raises(InvalidInput, match=f"^{re.escape(chip.resource_memory_name)} {asked} is invalid$"):
        fam(chip).admit(ctr(res(chip, "1", asked)), {})


def test_hami_core_memory_is_not_rounded() -> None:
    got = fam(B3).admit(ctr(res(B3, "1", "15360")), HAMI_CORE)
    assert got.limits[B3.resource_memory_name] == "15360"


def test_hami_core_allows_several_npus_with_a_share() -> None:
    got = fam(B3).admit(ctr(res(B3, "2", "15360")), HAMI_CORE)
    assert got.limits[B3.resource_memory_name] == "15360"


def test_no_memory_means_the_whole_card_written_to_limits_and_requests() -> None:
    got = fam(B3).admit(ctr(res(B3, "2")), {})
    assert got.limits[B3.resource_memory_name] == got.requests[B3.resource_memory_name] == "65536"


def test_count_only_in_requests_does_not_ask() -> None:
    c = ctr(requests=res(B3, "1", "2000"))
    got = fam(B3).admit(c, {})
    assert not got.asks
    assert got.limits == c.limits
    assert got.requests == c.requests
    assert got.env == {}


def test_overwrite_env_blanks_visible_devices_in_a_container_without_the_npu() -> None:
    assert fam(B3, overwrite_env=True).admit(ctr(), {}).env == {k.ASCEND_VISIBLE_DEVICES: ""}
    assert fam(B3).admit(ctr(), {}).env == {}
    assert fam(B3, overwrite_env=True).admit(ctr(res(B3, "1")), {}).env == {}


def test_runtime_class_is_proposed_only_when_configured() -> None:
    assert fam(B3, runtime_class_name="ascend").admit(ctr(res(B3, "1")), {}).runtime_class == "ascend"
    assert fam(B3).admit(ctr(res(B3, "1")), {}).runtime_class is None


def test_admit_does_not_change_the_callers_maps() -> None:
    c = ctr(res(C910, "1", "2000"), res(C910, "1"))
    fam(C910).admit(c, {})
    assert c.limits == res(C910, "1", "2000")
    assert c.requests == res(C910, "1")


def test_malformed_count_is_a_clear_error() -> None:
    with pytest.raises(InvalidInput, match=re.escape(B3.resource_name)):
        fam(B3).admit(ctr(res(B3, "two")), {})


# --- request parsing (A6, §1.4) -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chip", "limits", "want"),
    [
        pytest.param(A910A, res(A910A, "2", "8738"), req("Ascend910A", 2, 8738), id="count and memory"),
        pytest.param(A910A, res(A910A, "2"), req("Ascend910A", 2), id="count only: the whole card"),
        pytest.param(B3, res(B3, "1", "15360", "10"), req("Ascend910B3", 1, 15360, 10), id="hami-core shares"),
        pytest.param(
            replace(A910A, memory_factor=10), res(A910A, "1", "128"), req("Ascend910A", 1, 1280), id="factor 10"
        ),
        pytest.param(
            replace(A910A, memory_factor=100), res(A910A, "1", "128"), req("Ascend910A", 1, 12800), id="factor 100"
        ),
        pytest.param(replace(A910A, memory_factor=0), res(A910A, "1", "128"), req("Ascend910A", 1, 128), id="factor 0"),
    ],
)
def test_a6_requests(chip: ChipConfig, limits: dict[str, str], want: DeviceRequest) -> None:
    got = fam(chip).request(ctr(limits, limits))
    assert got == want
    assert got is not None
    assert (got.mem_percentage == 100) == (got.memreq == 0)


@pytest.mark.parametrize(
    ("limits", "requests", "want"),
    [
        pytest.param({}, {}, None, id="nothing asked"),
        pytest.param(res(B3, "0"), {}, None, id="count 0"),
        pytest.param({}, res(B3, "1"), req("Ascend910B3", 1), id="count from requests"),
    ],
)
def test_request_edges(limits: dict[str, str], requests: dict[str, str], want: DeviceRequest | None) -> None:
    assert fam(B3).request(ctr(limits, requests)) == want


@pytest.mark.parametrize(
    ("limits", "why"),
    [
        pytest.param(res(B3, "1.5"), "it is not a whole number", id="a fractional count"),
        pytest.param(res(B3, str(2**31)), "it is too large", id="count beyond int32"),
        pytest.param(res(B3, "1", "16Gi"), "it is too large", id="memory is MiB: 16Gi is beyond int32"),
        pytest.param(res(B3, "1", "-1"), "it is negative", id="negative memory"),
        pytest.param(res(B3, "1", "1500m"), "it is not a whole number", id="fractional memory"),
        pytest.param(res(B3, "1", core="-1"), "it is negative", id="negative core"),
        pytest.param(res(B3, "0", "16Gi"), "it is too large", id="read even where the count is 0"),
    ],
)
def test_a_quantity_that_cannot_be_read_is_an_error_never_no_npu(limits: dict[str, str], why: str) -> None:
    """HAMi reads these as asking for no NPU, and the pod was bound with no placement; here they are refused."""
    with pytest.raises(InvalidInput, match=f"{why}; it must be a whole number from 0 to 2147483647"):
        fam(B3).request(ctr(limits))


def test_memory_factor_overflowing_int32_is_refused_with_the_range_of_the_written_value() -> None:
    with pytest.raises(InvalidInput, match="it is too large; it must be a whole number from 0 to 1073741823"):
        fam(replace(B3, memory_factor=2)).request(ctr(res(B3, "1", str(2**30))))


@given(st.dictionaries(st.sampled_from(sorted(res(B3, "x", "x", "x"))), st.text(max_size=12), max_size=3))
def test_request_and_admit_never_crash_on_any_quantity(limits: dict[str, str]) -> None:
    family = fam(B3)
    for step in (lambda: family.request(ctr(limits)), lambda: family.admit(ctr(limits), {})):
        with contextlib.suppress(InvalidInput):
            step()


# --- node registration (§1.2) ------------------------------------------------------------------------------------

UPSTREAM_REGISTER = (
    '[{"ID":"GPU-0","Count":4,"Devmem":8738,"Devcore":8,"Type":"huawei.com/Ascend910","Numa":0,"Health":true}]'
)
SPEC_REGISTER = (
    '[{"id":"die0","count":4,"devmem":65536,"devcore":20,"type":"Ascend910B3","health":true,"custominfo":{"NetworkID":0}},'
    '{"id":"die4","index":4,"count":4,"devmem":65536,"devcore":20,"type":"Ascend910B3","health":true,"custominfo":{"NetworkID":1}}]'
)

ONE_REGISTER = '[{"id":"die0","count":4,"devmem":65536,"devcore":100,"type":"Ascend910B3","health":true}]'


def node_view(word: str, register: str | None, **annotations: str) -> NodeView:
    annos = dict(annotations)
    if register is not None:
        annos[k.register_key(word)] = register
    return NodeView(name="n", annotations=annos)


def test_register_keys_are_case_insensitive_as_in_go() -> None:
    (dev,) = fam(A910A).node_devices(node_view("Ascend910A", UPSTREAM_REGISTER))
    assert (dev.id, dev.count, dev.totalmem, dev.totalcore, dev.type, dev.numa, dev.health) == (
        "GPU-0",
        4,
        8738,
        8,
        "huawei.com/Ascend910",
        0,
        True,
    )
    assert dev.network_id is None


def test_spec_example_gives_network_groups_and_the_nodes_mode() -> None:
    devices = fam(B3).node_devices(node_view("Ascend910B3", SPEC_REGISTER, **{k.NODE_VNPU_CORE: "false"}))
    assert [(d.id, d.index, d.network_id, d.mode) for d in devices] == [
        ("die0", 0, 0, k.MODE_TEMPLATE),
        ("die4", 4, 1, k.MODE_TEMPLATE),
    ]


@pytest.mark.parametrize(
    ("flag", "default", "mode"),
    [
        pytest.param("true", False, k.MODE_HAMI_CORE, id="annotation true wins over the default"),
        pytest.param("false", True, k.MODE_TEMPLATE, id="annotation false wins over the default"),
        pytest.param(None, True, k.MODE_HAMI_CORE, id="no annotation: hamiVnpuCore decides"),
        pytest.param(None, False, k.MODE_TEMPLATE, id="no annotation and no default: template"),
    ],
)
def test_node_mode_comes_from_its_annotation_else_the_config(flag: str | None, default: bool, mode: str) -> None:
    annotations = {} if flag is None else {k.NODE_VNPU_CORE: flag}
    family = AscendFamily(chip=B3, hami_vnpu_core=default)
    assert {d.mode for d in family.node_devices(node_view("Ascend910B3", SPEC_REGISTER, **annotations))} == {mode}


@pytest.mark.parametrize(
    ("custominfo", "want"),
    [
        pytest.param({"NetworkID": 1.0}, 1, id="a float, as Go reads it"),
        pytest.param({"NetworkID": 2.9}, 2, id="truncated like Go's int()"),
        pytest.param({"networkid": 1}, None, id="custominfo keys are not folded"),
        pytest.param({"NetworkID": "1"}, None, id="a string is not a number"),
        pytest.param({"NetworkID": True}, None, id="a bool is not a number"),
        pytest.param({}, None, id="absent"),
    ],
)
def test_network_id_is_an_exact_numeric_custominfo_entry(custominfo: dict[str, Any], want: int | None) -> None:
    text = json.dumps([{"id": "d", "type": "Ascend910B3", "health": True, "CustomInfo": custominfo}])
    (dev,) = fam(B3).node_devices(node_view("Ascend910B3", text))
    assert dev.network_id == want


@pytest.mark.parametrize(
    ("register", "message"),
    [
        pytest.param(None, "annos not found hami.io/node-register-Ascend910B3", id="no annotation"),
        pytest.param("[]", "no device found on node", id="an empty array"),
        pytest.param("", "failed to unmarshal node devices", id="empty text"),
        pytest.param('{"id":"x"}', "failed to unmarshal node devices", id="an object, not an array"),
        pytest.param('["x"]', "failed to unmarshal node devices", id="a device that is not an object"),
        pytest.param('[{"id":"x","count":-1}]', "failed to unmarshal node devices", id="a negative count"),
        pytest.param('[{"id":"x","count":1.5}]', "failed to unmarshal node devices", id="a fractional count"),
        pytest.param('[{"id":"x","health":1}]', "failed to unmarshal node devices", id="health is a bool"),
        pytest.param('[{"count":1}]', "has no id", id="no id"),
        pytest.param("[" * 5000 + "]" * 5000, "failed to unmarshal node devices", id="absurd nesting"),
    ],
)
def test_bad_registration_is_hamis_error(register: str | None, message: str) -> None:
    with pytest.raises(AnnotationError, match=message) as err:
        fam(B3).node_devices(node_view("Ascend910B3", register))
    assert err.value.key == "hami.io/node-register-Ascend910B3"


def test_register_round_trips_through_the_plugins_json() -> None:
    decoded = decode_register(SPEC_REGISTER, "Ascend910B3")
    assert json.loads(encode_register(decoded)) == json.loads(SPEC_REGISTER)
    assert decode_register(encode_register(decoded), "Ascend910B3") == decoded


@given(st.text(max_size=200))
def test_any_register_text_decodes_or_is_an_annotation_error(text: str) -> None:
    try:
        devices = fam(B3).node_devices(node_view("Ascend910B3", text))
    except AnnotationError:
        return
    assert devices
    assert all(d.id for d in devices)


@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["id", "ID", "Index", "count", "COUNT", "devmem", "type", "health", "custominfo", "x"]),
            st.one_of(
                st.integers(-5, 2**32), st.text(max_size=5), st.booleans(), st.none(), st.floats(allow_nan=False)
            ),
            max_size=6,
        ),
        max_size=4,
    )
)
def test_any_register_json_decodes_or_is_an_annotation_error(items: list[dict[str, Any]]) -> None:
    with contextlib.suppress(AnnotationError):
        fam(B3).node_devices(node_view("Ascend910B3", json.dumps(items)))


@pytest.mark.parametrize(
    ("word", "index", "want"),
    [
        pytest.param("Ascend910A", 5, 1, id="910A position 5: second ring"),
        pytest.param("Ascend910B3", 3, 0, id="910B position 3: first ring"),
        pytest.param("Ascend910B3", 4, 1, id="910B position 4: second ring"),
        pytest.param("Ascend910C", 4, 0, id="910C: one fabric"),
        pytest.param("Ascend310P", 4, None, id="310P registers none"),
    ],
)
def test_a12_plugin_network_id(word: str, index: int, want: int | None) -> None:
    assert plugin_network_id(word, index) == want


# --- fit (A8-A11, §1.6) ------------------------------------------------------------------------------------------


def test_a8_fit_picks_the_last_card() -> None:
    devices = tuple(npu(f"dev-{i}", "Ascend910A", totalmem=128, count=100, totalcore=100) for i in range(2))
    assert uuids(fit(fam(A910A), devices, req("Ascend910A", 1, 64, 50))) == ["dev-1"]


def test_a9_multi_npu_fills_the_largest_network_group() -> None:
    devices = (npu("dev-0", network_id=0), npu("dev-1", network_id=1), npu("dev-2", network_id=1))
    assert uuids(fit(fam(B3), devices, req("Ascend910B3", 2))) == ["dev-2", "dev-1"]


def test_network_groups_with_spill_over_take_the_largest_first() -> None:
    devices = tuple(npu(f"d{i}", index=i, network_id=0 if i < 2 else 1) for i in range(5))
    assert uuids(fit(fam(B3), devices, req("Ascend910B3", 4))) == ["d4", "d3", "d2", "d1"]


def test_topology_single_npu_takes_the_first_walked() -> None:
    devices = (npu("dev-0", network_id=0), npu("dev-1", network_id=1))
    assert uuids(fit(fam(B3), devices, req("Ascend910B3", 1))) == ["dev-1"]


def test_topology_too_few_npus_counts_the_partial_pick() -> None:
    devices = (npu("dev-0", network_id=0), npu("dev-1", network_id=1, used=4))
    got = fit(fam(B3), devices, req("Ascend910B3", 2))
    assert render_reasons(got.rejected, got.checked) == (
        "1/2 AllocatedCardsInsufficientRequest, 1/2 CardTimeSlicingExhausted"
    )


def test_310p_never_groups_by_network() -> None:
    devices = (
        npu("a", "Ascend310P", network_id=0),
        npu("b", "Ascend310P", network_id=1),
        npu("c", "Ascend310P", network_id=0),
    )
    assert uuids(fit(fam(P310), devices, req("Ascend310P", 2))) == ["c", "b"]


def test_a10_hami_core_pod_on_a_template_node_is_mode_not_fit() -> None:
    family = fam(B3)
    devices = family.node_devices(node_view("Ascend910B3", SPEC_REGISTER))
    got = fit(family, devices, req("Ascend910B3", 1, 8192, 10), HAMI_CORE)
    assert not got.fits
    assert render_reasons(got.rejected, got.checked) == "1/2 ModeNotFit"


def test_a10_pod_without_a_mode_follows_a_hami_core_node() -> None:
    family = fam(B3)
    devices = family.node_devices(node_view("Ascend910B3", ONE_REGISTER, **{k.NODE_VNPU_CORE: "true"}))
    assert uuids(fit(family, devices, req("Ascend910B3", 1, 16384))) == ["die0"]


def test_a10_whole_card_hami_core_pod_fits_a_hami_core_node() -> None:
    family = fam(B3)
    devices = family.node_devices(node_view("Ascend910B3", ONE_REGISTER, **{k.NODE_VNPU_CORE: "true"}))
    assert uuids(fit(family, devices, req("Ascend910B3", 1), HAMI_CORE)) == ["die0"]


def test_hami_core_pod_sees_a_hundred_cores_on_any_npu() -> None:
    devices = (npu("d", mode=k.MODE_HAMI_CORE, totalcore=20),)
    assert fit(fam(B3), devices, req("Ascend910B3", 1, 1024, 50), HAMI_CORE).fits
    got = fit(fam(B3), devices, req("Ascend910B3", 1, 1024, 50))
    assert got.rejected == {Reason.CARD_INSUFFICIENT_CORE: 1}


@pytest.mark.parametrize(
    ("indices", "nums", "want"),
    [
        pytest.param((0, 1, 2), 2, ["dev-1", "dev-0"], id="one whole module of three NPUs"),
        pytest.param((0, 1, 2, 4, 6), 4, None, id="one whole module for four NPUs fails"),
        pytest.param((0, 2), 2, None, id="two half modules fail"),
        pytest.param((0, 1, 2, 3), 4, ["dev-3", "dev-2", "dev-1", "dev-0"], id="two whole modules"),
    ],
)
def test_a11_910c_takes_whole_modules(indices: tuple[int, ...], nums: int, want: list[str] | None) -> None:
    devices = tuple(npu(f"dev-{i}", "Ascend910C", index=i, count=1, totalmem=32000, network_id=0) for i in indices)
    got = fit(fam(C910), devices, req("Ascend910C", nums))
    if want is not None:
        assert uuids(got) == want
    else:
        assert not got.fits
        assert got.checked == nums
        assert Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST in got.rejected


def test_a11_910c_pairing_counts_the_paired_npus_out_of_the_request() -> None:
    devices = tuple(npu(f"dev-{i}", "Ascend910C", index=i, count=1, network_id=0) for i in (0, 1, 2, 4, 6))
    got = fit(fam(C910), devices, req("Ascend910C", 4))
    assert render_reasons(got.rejected, got.checked) == "2/4 AllocatedCardsInsufficientRequest"


def test_a11_910c_pairs_without_network_ids() -> None:
    devices = tuple(npu(f"dev-{i}", "Ascend910C", index=i, count=1) for i in (0, 1))
    assert len(fit(fam(C910), devices, req("Ascend910C", 2)).devices) == 2


def test_910b4_request_never_lands_on_910b4_1_npus() -> None:
    family = fam(B4)
    devices = (npu("x", "Ascend910B4-1"),)
    assert family.owns(devices[0])  # HAMi's substring selection still hands the card to the 910B4 backend ...
    got = fit_container(devices, req("Ascend910B4"), fit_ctx(family, devices), {family.word: family})
    assert not got.fits  # ... but the exact type check refuses it
    assert render_reasons(got.rejected, got.checked) == "1/1 CardTypeMismatch"


def test_910b4_1_request_fits_its_own_npus() -> None:
    family = fam(B4_1)
    devices = (npu("x", "Ascend910B4-1"),)
    assert uuids(fit_container(devices, req("Ascend910B4-1"), fit_ctx(family, devices), {family.word: family})) == ["x"]


def test_use_and_nouse_uuid_keys_are_the_models_own() -> None:
    devices = (npu("a"), npu("b"))
    family = fam(B3)
    assert uuids(fit(family, devices, req("Ascend910B3"), {"hami.io/use-Ascend910B3-uuid": "a"})) == ["a"]
    assert uuids(fit(family, devices, req("Ascend910B3"), {"hami.io/no-use-Ascend910B3-uuid": "b"})) == ["a"]
    assert uuids(fit(family, devices, req("Ascend910B3"), {"nvidia.com/use-gpuuuid": "a"})) == ["b"]


def test_mutex_policy_refuses_a_used_npu() -> None:
    devices = (npu("a"), npu("b", used=1))
    got = fit(fam(B3), devices, req("Ascend910B3"), {"hami.io/gpu-scheduler-policy": "mutex"})
    assert uuids(got) == ["a"]


def test_fit_grants_carry_the_common_word() -> None:
    (grant,) = fit(fam(B3), (npu("a"),), req("Ascend910B3", 1, 16384)).devices
    assert grant == ContainerDevice(uuid="a", type="Ascend910B3", usedmem=16384, usedcores=0)


# --- node score (§1.6) ---------------------------------------------------------------------------------------------


def grant(uuid: str, mem: int = 0, core: int = 0, type: str = "Ascend910B3") -> ContainerDevice:
    return ContainerDevice(uuid=uuid, type=type, usedmem=mem, usedcores=core)


def test_score_rewards_containers_kept_in_one_network_group() -> None:
    node = NodeUsage(name="n", devices=(npu("a", network_id=0), npu("b", network_id=0), npu("c", network_id=1)))
    assert fam(B3).score_node(node, [[grant("a"), grant("b")], [], [grant("a"), grant("c")]]) == 15.0


def test_score_is_zero_when_any_npu_lacks_a_network_id() -> None:
    node = NodeUsage(name="n", devices=(npu("a", network_id=0), npu("b")))
    assert fam(B3).score_node(node, [[grant("a")], [grant("b")]]) == 0.0


def test_score_is_zero_for_non_910_models() -> None:
    node = NodeUsage(name="n", devices=(npu("a", "Ascend310P", network_id=0),))
    assert fam(P310).score_node(node, [[grant("a", type="Ascend310P")]]) == 0.0


# --- pod annotations (A7, §1.5) -----------------------------------------------------------------------------------

EMPTY_NODE = NodeUsage(name="n", devices=())
# Upstream's A7 chip: 910A templates, capacity 1024.
A7_CHIP = replace(A910A, memory_capacity=1024)


def test_a7_template_mode_writes_lists_and_the_runtime_json() -> None:
    picked = [[grant("device-0", 8738, 1, type="Ascend")]]
    got = fam(A7_CHIP).pod_annotations(EMPTY_NODE, picked, {VGPU_TIME: "1700000000"})
    assert got == {
        "hami.io/Ascend910A-devices-to-allocate": "device-0,Ascend,8738,1:;",
        "hami.io/Ascend910A-devices-allocated": "device-0,Ascend,8738,1:;",
        "huawei.com/Ascend910A": '[{"UUID":"device-0","temp":"vir08","memory":8738,"core":1}]',
        k.PREDICATE_TIME: "1700000000",
    }


def test_a7_hami_core_mode_writes_no_template() -> None:
    got = fam(B3).pod_annotations(EMPTY_NODE, [[grant("ascend-uuid-1", 8192, 5)]], HAMI_CORE)
    assert got["huawei.com/Ascend910B3"] == '[{"UUID":"ascend-uuid-1","memory":8192,"core":5}]'


def test_a7_zero_core_is_left_out() -> None:
    got = fam(B3).pod_annotations(EMPTY_NODE, [[grant("ascend-uuid-1", 8192, 0)]], HAMI_CORE)
    assert got["huawei.com/Ascend910B3"] == '[{"UUID":"ascend-uuid-1","memory":8192}]'


def test_whole_card_has_no_template_and_every_container_is_listed() -> None:
    picked = [[], [grant("die0", 65536)], [grant("die4", 16384), grant("die5", 16384)]]
    got = fam(B3).pod_annotations(EMPTY_NODE, picked, {})
    assert json.loads(got["huawei.com/Ascend910B3"]) == [
        {"UUID": "die0", "memory": 65536},
        {"UUID": "die4", "temp": "vir05_1c_16g", "memory": 16384},
        {"UUID": "die5", "temp": "vir05_1c_16g", "memory": 16384},
    ]
    to_allocate = got["hami.io/Ascend910B3-devices-to-allocate"]
    assert to_allocate == ";die0,Ascend910B3,65536,0:;die4,Ascend910B3,16384,0:die5,Ascend910B3,16384,0:;"
    assert [list(c) for c in decode_pod_devices(to_allocate)][:3] == [list(c) for c in picked]
    assert k.PREDICATE_TIME not in got  # no vgpu-time given: the core reads no clock


def test_no_npu_placed_writes_nothing() -> None:
    assert fam(B3).pod_annotations(EMPTY_NODE, [[], []], {VGPU_TIME: "1"}) == {}


def test_runtime_entry_round_trips() -> None:
    from hami_common.vendors.ascend import NpuRuntime

    entry = NpuRuntime(uuid="d", temp="vir05_1c_16g", memory=16384, core=0)
    text = msgspec.json.encode(entry).decode()
    assert text == '{"UUID":"d","temp":"vir05_1c_16g","memory":16384}'
    assert msgspec.json.decode(text, type=NpuRuntime) == entry


def test_registered_npu_field_names_are_hamis() -> None:
    assert RegisteredNpu.__struct_fields__[:6] == ("id", "index", "count", "devmem", "devcore", "type")


@pytest.mark.parametrize(
    ("annotations", "usedmem", "usedcores", "want"),
    [
        pytest.param({}, 16384, 0, '[{"UUID":"die4","temp":"vir05_1c_16g","memory":16384}]', id="spec template"),
        pytest.param(HAMI_CORE, 28672, 40, '[{"UUID":"die4","memory":28672,"core":40}]', id="spec hami-core"),
    ],
)
def test_spec_examples_of_the_runtime_annotation(
    annotations: dict[str, str], usedmem: int, usedcores: int, want: str
) -> None:
    got = fam(B3).pod_annotations(EMPTY_NODE, [[grant("die4", usedmem, usedcores)]], annotations)
    assert got["huawei.com/Ascend910B3"] == want
    assert got["hami.io/Ascend910B3-devices-to-allocate"] == f"die4,Ascend910B3,{usedmem},{usedcores}:;"


# --- handshake (§0.2, §1.2) -----------------------------------------------------------------------------------------


def test_the_plugins_report_asks_for_a_refresh_on_the_models_own_key() -> None:
    family = fam(B3)
    now = datetime(2026, 8, 21, 8, 20, 50)
    node = NodeView(
        name="n",
        annotations={"hami.io/node-handshake-Ascend910B3": "Reported_2026.08.21 08:20:40"},
        allocatable={B3.resource_name: "32"},
    )
    key = family.handshake_key
    assert key is not None
    value = node.annotations.get(key)
    outcome = handshake_verdict(key, value, now, allocatable_count(node.allocatable, family.resource_names[0]))
    assert (outcome.healthy, outcome.need_update, outcome.patch) == (True, True, "Requesting_2026-08-21 08:20:50")
    stale = handshake_verdict(key, "Requesting_2026-08-21 08:00:00", now, 0)
    assert (stale.healthy, stale.need_update) == (False, False)
