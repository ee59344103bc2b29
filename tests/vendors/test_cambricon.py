"""Cambricon MLU: HAMi's table C1-C6 (hami-vendors §2.7) plus config, codecs and malformed input."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_common.annotations.devices import ContainerDevice, decode_pod_devices
from hami_common.annotations.timestamps import encode_rfc3339
from hami_common.errors import AnnotationError, InvalidInput
from hami_common.resources import ContainerResources, DeviceRequest
from hami_common.scheduling.policy import PodPreferences
from hami_common.scheduling.quota import quota_from_hard
from hami_common.scheduling.reason import render_reasons
from hami_common.scheduling.usage import DeviceUsage, NodeUsage
from hami_common.scheduling.vendor import ContainerFit, FitContext
from hami_common.vendors import NodeView
from hami_common.vendors.cambricon import (
    CambriconConfig,
    CambriconFamily,
    LockAction,
    families,
    lock_decision,
    parse_section,
)
from hami_common.vendors.cambricon.keys import (
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    DSMLU_ASSIGHED,
    DSMLU_ASSIGNED,
    DSMLU_PROFILE,
    MLU_CORES,
    MLU_COUNT,
    MLU_MEMORY,
    NODE_LOCK,
)

FAMILY = CambriconFamily()


def mlu(i: int, **kw: object) -> DeviceUsage:
    base: dict[str, object] = {
        "id": f"dev-{i}",
        "index": i,
        "count": 100,
        "totalmem": 128,
        "totalcore": 100,
        "type": "MLU",
    }
    base.update(kw)
    return DeviceUsage(**base)  # type: ignore[arg-type]


def fit(devs: tuple[DeviceUsage, ...], req: DeviceRequest, ctx: FitContext | None = None) -> ContainerFit:
    return FAMILY.fit(devs, req, ctx or FitContext(prefs=PodPreferences(), node=NodeUsage("n", devs)))


def why(result: ContainerFit) -> str:
    return render_reasons(result.rejected, result.checked)


def req(nums: int = 1, mem: int = 0, cores: int = 100) -> DeviceRequest:
    return DeviceRequest(nums=nums, memreq=mem, mem_percentage=100 if mem == 0 else 0, coresreq=cores, type="MLU")


# --- C1: devices from node capacity ---


def test_c1_one_device_from_capacity() -> None:
    (dev,) = FAMILY.node_devices(NodeView("test", capacity={MLU_CORES: "1", MLU_MEMORY: "1"}))
    assert (dev.id, dev.index, dev.count, dev.totalmem, dev.totalcore, dev.type, dev.health) == (
        "test-cambricon-mlu-0",
        0,
        100,
        25600,
        100,
        "MLU",
        True,
    )
    assert FAMILY.owns(dev)


def test_eight_48g_cards() -> None:
    devs = FAMILY.node_devices(NodeView("n1", capacity={MLU_CORES: "800", MLU_MEMORY: "1536"}))
    assert [d.id for d in devs] == [f"n1-cambricon-mlu-{i}" for i in range(8)]
    assert {d.totalmem for d in devs} == {49152}


@pytest.mark.parametrize("capacity", [{}, {MLU_CORES: "0", MLU_MEMORY: "10"}])
def test_no_vcore_capacity_is_no_device(capacity: dict[str, str]) -> None:
    with pytest.raises(AnnotationError, match=f"device not found {MLU_CORES}"):
        FAMILY.node_devices(NodeView("n", capacity=capacity))


@pytest.mark.parametrize("bad", ["1.5", "lots", "-100"])
def test_malformed_capacity_is_a_clear_error(bad: str) -> None:
    with pytest.raises(AnnotationError, match=MLU_CORES):
        FAMILY.node_devices(NodeView("n", capacity={MLU_CORES: bad, MLU_MEMORY: "1"}))


def test_no_handshake_and_own_lock() -> None:
    assert FAMILY.handshake_key is None
    lock = FAMILY.node_lock
    assert (lock.key, lock.expiry, lock.shared) == ("cambricon.com/dsmlu.lock", timedelta(minutes=2), False)
    assert FAMILY.resource_names == (MLU_COUNT, MLU_MEMORY, MLU_CORES)


# --- C2: requests ---

C2 = CambriconFamily(CambriconConfig(resource_count_name="cambricon.com/mlu"))


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ({"cambricon.com/mlu": "1", MLU_MEMORY: "1000", MLU_CORES: "2"}, req(1, 256000, 2)),
        ({"cambricon.com/mlu": "1", MLU_MEMORY: "1000"}, req(1, 256000, 100)),
        ({"cambricon.com/mlu": "1", MLU_CORES: "2"}, req(1, 0, 2)),
    ],
)
def test_c2_requests(limits: dict[str, str], expected: DeviceRequest | None) -> None:
    assert C2.request(ContainerResources("c", limits=limits)) == expected


def test_request_units_bounds_and_fallbacks() -> None:
    r = FAMILY.request(ContainerResources("c", requests={MLU_COUNT: "1", MLU_MEMORY: "8388607"}))
    assert r is not None
    assert r.memreq == 8388607 * 256
    assert r.mem_percentage == 0
    assert FAMILY.request(ContainerResources("c", limits={MLU_MEMORY: "4"})) is None
    # HAMi reads these as asking for no MLU (the pod was bound with no placement); here they are refused
    for limits, why in (
        ({MLU_MEMORY: "8388608"}, "it is too large; it must be a whole number from 0 to 8388607"),
        ({MLU_MEMORY: "16Gi"}, "it is too large; it must be a whole number from 0 to 8388607"),
        ({MLU_MEMORY: "16.0Gi"}, "it is too large; it must be a whole number from 0 to 8388607"),
        ({MLU_MEMORY: "1.5"}, "it is not a whole number"),
        ({MLU_CORES: "500m"}, "it is not a whole number"),
    ):
        with pytest.raises(InvalidInput, match=why):
            FAMILY.request(ContainerResources("c", limits={MLU_COUNT: "1", **limits}))


def test_admission_only_reports_the_count_in_limits() -> None:
    c = ContainerResources("c", limits={MLU_COUNT: "1"}, requests={MLU_MEMORY: "4"})
    verdict = FAMILY.admit(c, {})
    assert verdict.asks
    assert verdict.limits == c.limits
    assert verdict.requests == c.requests
    assert not FAMILY.admit(ContainerResources("c", requests={MLU_COUNT: "1"}), {}).asks


@given(st.dictionaries(st.sampled_from([MLU_COUNT, MLU_MEMORY, MLU_CORES]), st.text(max_size=30)))
def test_request_never_crashes(limits: dict[str, str]) -> None:
    with contextlib.suppress(InvalidInput):
        FAMILY.request(ContainerResources("c", limits=limits))


# --- C3: pod annotations ---

NODE = NodeUsage("n", (mlu(0, id="device-0"),))


def test_c3_pod_annotations() -> None:
    picked = ((ContainerDevice("device-0", "MLU", 256000, 1),),)
    annos = FAMILY.pod_annotations(NODE, picked, {})
    assert annos == {
        DEVICES_TO_ALLOCATE: "device-0,MLU,256000,1:;",
        DEVICES_ALLOCATED: "device-0,MLU,256000,1:;",
        DSMLU_PROFILE: "0_1_1000",
        DSMLU_ASSIGNED: "false",
        DSMLU_ASSIGHED: "false",
    }
    assert decode_pod_devices(annos[DEVICES_TO_ALLOCATE])[0] == picked[0]


def test_c3_leading_container_without_mlu() -> None:
    picked: tuple[tuple[ContainerDevice, ...], ...] = ((), (ContainerDevice("device-0", "MLU", 256000, 1),))
    annos = FAMILY.pod_annotations(NODE, picked, {})
    assert annos[DEVICES_TO_ALLOCATE] == ";device-0,MLU,256000,1:;"
    assert annos[DSMLU_PROFILE] == "0_1_1000"


def test_profile_uses_the_card_index_and_memory_units() -> None:
    node = NodeUsage("n", (mlu(0, id="n-cambricon-mlu-0"), mlu(3, id="n-cambricon-mlu-3")))
    picked = ((ContainerDevice("n-cambricon-mlu-3", "MLU", 5120, 10),),)
    assert FAMILY.pod_annotations(node, picked, {})[DSMLU_PROFILE] == "3_10_20"
    gone = ((ContainerDevice("n-cambricon-mlu-5", "MLU", 5120, 10),),)
    assert FAMILY.pod_annotations(node, gone, {})[DSMLU_PROFILE] == "5_10_20"


def test_no_mlu_placed_writes_nothing() -> None:
    assert FAMILY.pod_annotations(NODE, ((), ()), {}) == {}


# --- C4: lock ---

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


def test_c4_no_lock_is_taken() -> None:
    d = lock_decision("n", None, NOW)
    assert d.action is LockAction.TAKE
    assert d.granted
    assert d.value == "2025-06-01T12:00:00Z"


def test_c4_recent_lock_refuses_with_hamis_message() -> None:
    d = lock_decision("n", encode_rfc3339(NOW - timedelta(minutes=1)), NOW)
    assert d.action is LockAction.REFUSE
    assert not d.granted
    assert d.message == "node n has been locked within 2 minutes"


def test_c4_old_lock_is_replaced() -> None:
    d = lock_decision("n", encode_rfc3339(NOW - timedelta(hours=1)), NOW)
    assert d.action is LockAction.REPLACE
    assert d.value == "2025-06-01T12:00:00Z"


def test_c4_unparsable_lock_is_an_error() -> None:
    with pytest.raises(AnnotationError, match=NODE_LOCK):
        lock_decision("n", "invalid-format", NOW)


# --- C5: fit ---


def test_c5_picks_the_last_card() -> None:
    devs = (mlu(0), mlu(1))
    assert [d.uuid for d in fit(devs, req(1, 64, 50)).devices] == ["dev-1"]


@pytest.mark.parametrize(
    ("dev", "request_", "reason"),
    [
        (mlu(0), req(1, 512, 50), "1/1 CardInsufficientMemory"),
        (mlu(0, used=100), req(1, 64, 50), "1/1 CardTimeSlicingExhausted"),
        (mlu(0, used=20), req(1, 64, 100), "1/1 ExclusiveDeviceAllocateConflict"),
        (mlu(0, used=1, usedcores=100), req(1, 64, 0), "1/1 CardComputeUnitsExhausted"),
        (mlu(0), req(2, 64, 50), "1/1 AllocatedCardsInsufficientRequest"),
        (mlu(0, health=False), req(1, 64, 50), "1/1 CardNotHealth"),
    ],
)
def test_c5_refusals(dev: DeviceUsage, request_: DeviceRequest, reason: str) -> None:
    assert why(fit((dev,), request_)) == reason


def test_c5_cores_above_100_are_clamped() -> None:
    (grant,) = fit((mlu(0),), req(1, 64, 120)).devices
    assert grant.usedcores == 100


def test_whole_card_request_conflicts_with_any_user() -> None:
    assert why(fit((mlu(0, used=1, usedmem=10, usedcores=10),), req())) == "1/1 CardInsufficientMemory"
    assert why(fit((mlu(0, used=1),), req())) == "1/1 ExclusiveDeviceAllocateConflict"


def test_use_uuid_annotation_is_cambricons() -> None:
    devs = (mlu(0), mlu(1))
    prefs = FAMILY.preferences(PodPreferences(), {"cambricon.com/use-gpuuuid": "dev-0"})
    ctx = FitContext(prefs=prefs, node=NodeUsage("n", devs))
    assert [d.uuid for d in fit(devs, req(1, 64, 50), ctx).devices] == ["dev-0"]
    ignored = FAMILY.preferences(PodPreferences(), {"cambricon.com/use-mlutype": "MLU590"})
    assert ignored.use_types == ()


# --- C6: quota ---


def quota_ctx(devs: tuple[DeviceUsage, ...], limit: str) -> FitContext:
    quota = quota_from_hard([{f"limits.{MLU_MEMORY}": limit}], memory_name=MLU_MEMORY, core_name=MLU_CORES)
    return FitContext(prefs=PodPreferences(), node=NodeUsage("n", devs), quota=quota)


def test_c6_quota_in_256_mib_units() -> None:
    devs = (mlu(0, totalmem=40960),)
    assert why(fit(devs, req(), quota_ctx(devs, "50"))) == "1/1 ResourceQuotaNotFit"
    # 50 units are 12800 MiB: a 40-unit request (10240 MiB) fits, so the factor is applied.
    assert fit(devs, req(1, 40 * 256, 10), quota_ctx(devs, "50")).fits


# --- config ---


def test_config_defaults_and_factory() -> None:
    assert parse_section(None) == CambriconConfig()
    custom = parse_section({"resourceCountName": "cambricon.com/mlu"})
    assert custom.resource_count_name == "cambricon.com/mlu"
    assert families(None) == ()
    (family,) = families(custom)
    assert family.word == "MLU"
    assert family.resource_names[0] == "cambricon.com/mlu"


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"resourceCountName": 3}, r"cambricon\.resourceCountName"),
        ({"unknown": "x"}, "unknown"),
        ({"resourceCountName": "vmlu"}, "not an extended resource name"),
        ({"resourceCountName": MLU_MEMORY}, "share a name"),
        ("text", "cambricon"),
    ],
)
def test_bad_config_names_the_key(raw: object, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        parse_section(raw)
