"""Hygon DCU: HAMi's table H1-H6 (hami-vendors §3.6) plus the register codec, config and Allocate contract."""

from __future__ import annotations

import contextlib
from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_common.annotations.devices import ContainerDevice
from hami_common.annotations.registration import DeviceInfo
from hami_common.errors import AnnotationError, InvalidInput
from hami_common.resources import ContainerResources, DeviceRequest
from hami_common.scheduling.policy import PodPreferences
from hami_common.scheduling.reason import render_reasons
from hami_common.scheduling.usage import DeviceUsage, NodeUsage
from hami_common.scheduling.vendor import ContainerFit, FitContext
from hami_common.vendors import NodeView
from hami_common.vendors._common import handshake_verdict, type_filter
from hami_common.vendors.hygon import (
    DrmNodes,
    HygonConfig,
    HygonFamily,
    Mount,
    VdevSlot,
    allocate_contract,
    decode_register,
    encode_register,
    families,
    parse_section,
)
from hami_common.vendors.hygon.keys import (
    DCU_CORES,
    DCU_COUNT,
    DCU_MEMORY,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_HANDSHAKE,
    NODE_REGISTER,
)

FAMILY = HygonFamily()


def dcu(i: int, **kw: object) -> DeviceUsage:
    base: dict[str, object] = {"id": f"dev-{i}", "index": i, "count": 4, "totalmem": 128, "totalcore": 100}
    base["type"] = "DCU"
    base.update(kw)
    return DeviceUsage(**base)  # type: ignore[arg-type]


def req(nums: int = 1, mem: int = 0, cores: int = 100, pct: int | None = None, type_: str = "DCU") -> DeviceRequest:
    percentage = pct if pct is not None else (100 if mem == 0 else 0)
    return DeviceRequest(nums=nums, memreq=mem, mem_percentage=percentage, coresreq=cores, type=type_)


def fit(devs: tuple[DeviceUsage, ...], r: DeviceRequest, annotations: dict[str, str] | None = None) -> ContainerFit:
    prefs = FAMILY.preferences(PodPreferences(), annotations or {})
    return FAMILY.fit(devs, r, FitContext(prefs=prefs, node=NodeUsage("n", devs)))


def why(result: ContainerFit) -> str:
    return render_reasons(result.rejected, result.checked)


# --- H1: register annotation ---


def node(value: str | None) -> NodeView:
    return NodeView("n", annotations={} if value is None else {NODE_REGISTER: value})


def test_h1_one_device() -> None:
    (dev,) = FAMILY.node_devices(node("test-0,1,1024,100,DCU,0,true,0,test:"))
    assert (dev.id, dev.index, dev.mode, dev.count, dev.totalmem, dev.totalcore) == ("test-0", 0, "test", 1, 1024, 100)
    assert FAMILY.owns(dev)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (None, f"annos not found {NODE_REGISTER}"),
        (":", "no gpu found on node"),
        ("", "no device separator"),
        ("test-0,1,1024,100,DCU:", "unexpected field count 5 in node annotation"),
        ("test-0:", "malformed node annotation segment"),
        ("a,1,2,3,DCU,0,true,-1,hami:", "negative"),
        ("a,x,2,3,DCU,0,true:", "count field is not an integer"),
        ("a,1,2,3,DCU,0,maybe:", "health field is not a boolean"),
    ],
)
def test_h1_errors(value: str | None, match: str) -> None:
    with pytest.raises(AnnotationError, match=match) as err:
        FAMILY.node_devices(node(value))
    assert err.value.key == NODE_REGISTER


ILLUSTRATIVE = (
    "DCU-1234567890,4,65520,100,DCU-K100_AI,0,true,0,hami:DCU-1234567891,4,65520,100,DCU-K100_AI,0,true,1,hami:"
)


def test_register_round_trips_the_spec_example() -> None:
    devices = decode_register(ILLUSTRATIVE)
    assert [(d.id, d.index, d.count, d.devmem, d.type, d.mode) for d in devices] == [
        ("DCU-1234567890", 0, 4, 65520, "DCU-K100_AI", "hami"),
        ("DCU-1234567891", 1, 4, 65520, "DCU-K100_AI", "hami"),
    ]
    assert encode_register(devices) == ILLUSTRATIVE


def test_seven_fields_mean_index_0_and_hami_core() -> None:
    (dev,) = decode_register("d,4,100,100,DCU-Z100,0,false:")
    assert (dev.index, dev.mode, dev.health) == (0, "hami-core", False)
    assert encode_register((dev,)) == "d,4,100,100,DCU-Z100,0,false,0,hami-core:"


def test_encode_refuses_separators() -> None:
    with pytest.raises(ValueError, match="holds"):
        encode_register((DeviceInfo(id="a:b", type="DCU", mode="hami", count=1),))


_WORD = st.text(st.sampled_from("abcDEF019-_."), min_size=1, max_size=12)
_NUM = st.integers(0, 2**31 - 1)


@given(
    st.lists(
        st.builds(
            DeviceInfo,
            id=_WORD,
            index=_NUM,
            count=_NUM,
            devmem=_NUM,
            devcore=_NUM,
            type=_WORD,
            numa=_NUM,
            mode=_WORD,
            health=st.booleans(),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_register_round_trip(devices: list[DeviceInfo]) -> None:
    assert decode_register(encode_register(devices)) == tuple(devices)


@given(st.text(max_size=80))
def test_register_decode_never_crashes(value: str) -> None:
    with contextlib.suppress(AnnotationError):
        decode_register(value)


# --- H2: handshake ---


def test_h2_handshake() -> None:
    now = datetime(2025, 6, 1, 0, 0, 0)
    stale = handshake_verdict(FAMILY.handshake_key, "Requesting_2025-01-07 00:00:00", now, 0)
    assert (stale.healthy, stale.need_update) == (False, False)
    fresh = handshake_verdict(FAMILY.handshake_key, "Unknown", now, 0)
    assert (fresh.healthy, fresh.need_update, fresh.patch) == (True, True, "Requesting_2025-06-01 00:00:00")
    assert FAMILY.handshake_key == NODE_HANDSHAKE == "hami.io/node-handshake-dcu"


def test_shared_lock() -> None:
    lock = FAMILY.node_lock
    assert (lock.key, lock.shared) == ("hami.io/mutex.lock", True)


# --- H3: type filter ---


@pytest.mark.parametrize(
    ("use", "nouse", "card", "ok"),
    [
        ("dcu", None, "dcu", True),
        ("dcu", None, "test", False),
        ("dcu,test", None, "dcu", True),
        (None, "dcu", "dcu", False),
        (None, "test,dcu", "test", False),
        ("", None, "dcu", True),
        (None, "   ", "dcu", True),
    ],
)
def test_h3_type_filter(use: str | None, nouse: str | None, card: str, ok: bool) -> None:
    annotations = {}
    if use is not None:
        annotations["hygon.com/use-dcutype"] = use
    if nouse is not None:
        annotations["hygon.com/nouse-dcutype"] = nouse
    prefs = FAMILY.preferences(PodPreferences(), annotations)
    assert type_filter(card, prefs.use_types, prefs.nouse_types) is ok


def test_type_annotations_steer_the_fit() -> None:
    devs = (dcu(0, type="DCU-Z100"), dcu(1, type="DCU-K100_AI"))
    assert [d.uuid for d in fit(devs, req(1, 64, 10), {"hygon.com/use-dcutype": "z100"}).devices] == ["dev-0"]
    refused = fit(devs, req(1, 64, 10), {"hygon.com/nouse-dcutype": "DCU"})
    assert why(refused) == "2/2 CardTypeMismatch"


def test_uuid_annotations_are_hygons() -> None:
    devs = (dcu(0), dcu(1))
    assert [d.uuid for d in fit(devs, req(1, 64, 10), {"hygon.com/nouse-gpuuuid": "dev-1"}).devices] == ["dev-0"]
    assert [d.uuid for d in fit(devs, req(1, 64, 10), {"nvidia.com/nouse-gpuuuid": "dev-1"}).devices] == ["dev-1"]


# --- H4: requests ---


@pytest.mark.parametrize(
    ("limits", "requests", "expected"),
    [
        ({DCU_COUNT: "1", DCU_CORES: "1", DCU_MEMORY: "1024"}, {}, req(1, 1024, 1)),
        ({DCU_COUNT: "1"}, {DCU_CORES: "1", DCU_MEMORY: "1024"}, req(1, 1024, 1)),
        ({DCU_COUNT: "1", DCU_CORES: "1"}, {}, req(1, 0, 1)),
    ],
)
def test_h4_requests(limits: dict[str, str], requests: dict[str, str], expected: DeviceRequest | None) -> None:
    assert FAMILY.request(ContainerResources("c", limits=limits, requests=requests)) == expected


def test_count_only_is_exclusive() -> None:
    assert FAMILY.request(ContainerResources("c", limits={DCU_COUNT: "2"})) == req(2, 0, 100)
    assert FAMILY.request(ContainerResources("c", limits={DCU_COUNT: "0"})) is None


@pytest.mark.parametrize(
    ("limits", "why"),
    [
        ({DCU_COUNT: "1", DCU_MEMORY: "16Gi"}, "it is too large"),
        ({DCU_COUNT: "1", DCU_CORES: "-1"}, "it is negative"),
        ({DCU_COUNT: "1", DCU_MEMORY: "1.5"}, "it is not a whole number"),
        ({DCU_COUNT: "2147483648"}, "it is too large"),
    ],
)
def test_a_quantity_that_cannot_be_read_is_an_error_never_no_dcu(limits: dict[str, str], why: str) -> None:
    """HAMi reads these as asking for no DCU, and the pod was bound with no placement; here they are refused."""
    with pytest.raises(InvalidInput, match=f"{why}; it must be a whole number from 0 to 2147483647"):
        FAMILY.request(ContainerResources("c", limits=limits))


def test_memory_factor() -> None:
    doubled = HygonFamily(HygonConfig(memory_factor=2))
    r = doubled.request(ContainerResources("c", limits={DCU_COUNT: "1", DCU_MEMORY: "1024"}))
    assert r is not None
    assert r.memreq == 2048
    with pytest.raises(InvalidInput, match="it is too large; it must be a whole number from 0 to 1073741823"):
        doubled.request(ContainerResources("c", limits={DCU_COUNT: "1", DCU_MEMORY: str(2**30)}))
    zero = HygonFamily(HygonConfig(memory_factor=0))
    r = zero.request(ContainerResources("c", limits={DCU_COUNT: "1", DCU_MEMORY: "1024"}))
    assert r is not None
    assert r.memreq == 1024


@given(st.dictionaries(st.sampled_from([DCU_COUNT, DCU_MEMORY, DCU_CORES]), st.text(max_size=30)))
def test_request_never_crashes(limits: dict[str, str]) -> None:
    with contextlib.suppress(InvalidInput):
        FAMILY.request(ContainerResources("c", limits=limits))


# --- H5: fit ---


def test_h5_picks_the_last_card() -> None:
    assert [d.uuid for d in fit((dcu(0), dcu(1)), req(1, 64, 50)).devices] == ["dev-1"]


@pytest.mark.parametrize(
    ("dev", "r", "reason"),
    [
        (dcu(0), req(1, 512, 50), "1/1 CardInsufficientMemory"),
        (dcu(0, used=1, usedcores=100), req(1, 64, 50), "1/1 CardInsufficientCore"),
        (dcu(0), req(1, 64, 50, type_="OtherType"), "1/1 CardTypeMismatch"),
        (dcu(0, health=False), req(1, 64, 50), "1/1 CardNotHealth"),
    ],
)
def test_h5_refusals(dev: DeviceUsage, r: DeviceRequest, reason: str) -> None:
    assert why(fit((dev,), r)) == reason


def test_h5_percentage_on_a_shared_card() -> None:
    dev = dcu(0, used=1, usedmem=20, usedcores=10)
    (grant,) = fit((dev,), req(1, 0, 10, pct=10)).devices
    assert grant == ContainerDevice("dev-0", "DCU", 12, 10)


def test_no_quota_step() -> None:
    from hami_common.scheduling.quota import NamespaceQuota

    devs = (dcu(0),)
    ctx = FitContext(prefs=PodPreferences(), node=NodeUsage("n", devs), quota=NamespaceQuota(memory_limit=0))
    assert FAMILY.fit(devs, req(1, 64, 10), ctx).fits


# --- H6: pod annotations ---


def test_h6_pod_annotations() -> None:
    picked = ((ContainerDevice("test1", "DCU", 2048, 1),),)
    annos = FAMILY.pod_annotations(NodeUsage("n", ()), picked, {})
    assert annos == {DEVICES_TO_ALLOCATE: "test1,DCU,2048,1:;", DEVICES_ALLOCATED: "test1,DCU,2048,1:;"}
    assert FAMILY.pod_annotations(NodeUsage("n", ()), ((),), {}) == {}


# --- Allocate contract (§3.5) ---

DRM = {"DCU-1": DrmNodes(card=1, render=129), "DCU-2": DrmNodes(card=2, render=130)}
SLOT = VdevSlot(
    pci_bus_id="0000:03:00.0", device_id=0, vdev_id=3, pipe_id=1, cu_masks=("0xffff", "0x0"), compute_units=120
)


def test_vdcu_for_one_partial_card() -> None:
    out = allocate_contract(
        [ContainerDevice("DCU-1", "DCU", 2000, 60)],
        drm=DRM,
        first_card_memory=65520,
        pod_uid="uid",
        container="main",
        slot=SLOT,
    )
    assert [(d.path, d.permissions) for d in out.devices] == [
        ("/dev/kfd", "rwm"),
        ("/dev/mkfd", "rwm"),
        ("/dev/dri/card1", "rw"),
        ("/dev/dri/renderD129", "rw"),
    ]
    host = "/usr/local/vgpu/dcu/uid_main_0_1_3_0xffff_0x0"
    assert out.mounts == (
        Mount("/etc/vdev/docker/", host, read_only=False),
        Mount("/opt/hygondriver", "/opt/dtk", read_only=False),
        Mount("/opt/hyhal", "/opt/hyhal", read_only=True),
    )
    assert (out.vdev_dir, out.vdev_file, out.exporter_copy) == (host, "vdev3.conf", "/etc/vdev/vdev3.conf")
    assert out.vdev_text is not None
    assert out.vdev_text.splitlines() == [
        "PciBusId: 0000:03:00.0",
        "cu_mask: 0xffff",
        "cu_mask: 0x0",
        "cu_count: 72",
        "mem: 2000 MiB",
        "device_id: 0",
        "vdev_id: 3",
        "pipe_id: 1",
        "enable: 1",
    ]
    assert out.env == {}


@pytest.mark.parametrize(
    "devices",
    [
        [ContainerDevice("DCU-1", "DCU", 65520, 100)],
        [ContainerDevice("DCU-1", "DCU", 2000, 50), ContainerDevice("DCU-2", "DCU", 2000, 50)],
    ],
)
def test_whole_or_several_cards_get_no_vdcu(devices: list[ContainerDevice]) -> None:
    out = allocate_contract(devices, drm=DRM, first_card_memory=65520, pod_uid="u", container="c")
    assert out.mounts == (Mount("/opt/hyhal", "/opt/hyhal", read_only=True),)
    assert out.vdev_text is None
    assert len(out.devices) == 2 + 2 * len(devices)


def test_allocate_errors() -> None:
    with pytest.raises(InvalidInput, match="DCU-9 is not on this node"):
        allocate_contract(
            [ContainerDevice("DCU-9", "DCU", 1, 1)], drm=DRM, first_card_memory=10, pod_uid="u", container="c"
        )
    with pytest.raises(InvalidInput, match="carved slot"):
        allocate_contract(
            [ContainerDevice("DCU-1", "DCU", 1, 1)], drm=DRM, first_card_memory=10, pod_uid="u", container="c"
        )


# --- config ---


def test_config_defaults_and_factory() -> None:
    config = parse_section(None)
    assert config == HygonConfig()
    assert config.factor == 1
    assert parse_section({"memoryFactor": 0}).factor == 1
    assert families(None) == ()
    (family,) = families(parse_section({"resourceCountName": "hygon.com/dcu"}))
    assert family.resource_names == ("hygon.com/dcu", DCU_MEMORY, DCU_CORES)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"memoryFactor": "two"}, r"hygon\.memoryFactor"),
        ({"memoryFactor": -1}, "below 0"),
        ({"dcuResourceName": "x/y"}, "dcuResourceName"),
        ({"resourceCoreName": DCU_MEMORY}, "share a name"),
    ],
)
def test_bad_config_names_the_key(raw: object, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        parse_section(raw)
