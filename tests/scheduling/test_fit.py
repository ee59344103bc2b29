"""NVIDIA Fit: per-card checks in HAMi's order and its reason strings (hami-protocol §4.7, §8 cases 11-14)."""

from __future__ import annotations

from typing import Any

import pytest

from hami_common.resources import DeviceRequest
from hami_common.scheduling import NVIDIA, NamespaceQuota, PodPreferences, Reason, render_reasons
from hami_common.scheduling.vendor import FitContext
from tests.scheduling.builders import card, ctx, node, request


def verdict(devices: list[Any], req: DeviceRequest, c: FitContext | None = None) -> tuple[list[str], str]:
    fit = NVIDIA.fit(devices, req, c or ctx())
    return [d.uuid for d in fit.devices], render_reasons(fit.rejected, fit.checked) if not fit.fits else ""


# Case 11 (HAMi: pkg/device/nvidia/device_test.go TestDevices_Fit): the same inputs and expected answers.
CASE_11 = [
    pytest.param(
        [card("dev-0", totalmem=128), card("dev-1", totalmem=128)],
        request(memreq=64, cores=50),
        {},
        ["dev-1"],
        "",
        id="fit success picks the last card of the list",
    ),
    pytest.param(
        [card("dev-0", totalmem=128)],
        request(cores=50),
        {},
        [],
        "1/1 CardInsufficientMemory",
        id="a card short of memory is rejected as CardInsufficientMemory",
    ),
    pytest.param(
        [card("dev-0", totalmem=1024, usedcores=100)],
        request(cores=50),
        {},
        [],
        "1/1 CardInsufficientCore",
        id="a card short of cores is rejected as CardInsufficientCore",
    ),
    pytest.param(
        [card("dev-0", totalmem=128)],
        request(cores=50, type="OtherType"),
        {},
        [],
        "1/1 CardTypeMismatch",
        id="a request of another vendor is a CardTypeMismatch",
    ),
    pytest.param(
        [card("dev-1")],
        request(nums=2, cores=50),
        {"use_uuids": ("dev-0",)},
        [],
        "1/1 CardUuidMismatch",
        id="a card missing from use-gpuuuid is a CardUuidMismatch",
    ),
    pytest.param(
        [card("dev-0")],
        request(nums=2, cores=50),
        {"nouse_uuids": ("dev-0",)},
        [],
        "1/1 CardUuidMismatch",
        id="a card listed in nouse-gpuuuid is a CardUuidMismatch",
    ),
    pytest.param(
        [card("dev-0", used=100)],
        request(cores=50),
        {},
        [],
        "1/1 CardTimeSlicingExhausted",
        id="a card with every slot used is CardTimeSlicingExhausted",
    ),
    pytest.param(
        [card("dev-0")], request(cores=120), {}, ["dev-0"], "", id="cores above 100 are clamped to 100 and still fit"
    ),
    pytest.param(
        [card("dev-0", used=20)],
        request(cores=100),
        {},
        [],
        "1/1 ExclusiveDeviceAllocateConflict",
        id="an exclusive request on a shared card is an ExclusiveDeviceAllocateConflict",
    ),
    pytest.param(
        [card("dev-0", used=20, usedcores=100)],
        request(cores=0),
        {},
        [],
        "1/1 CardComputeUnitsExhausted",
        id="a zero-core request on a card with no cores left is refused",
    ),
    pytest.param(
        [card("dev-0", used=20, usedcores=10)],
        request(nums=2, cores=20),
        {},
        [],
        "1/1 AllocatedCardsInsufficientRequest",
        id="fewer cards than asked is AllocatedCardsInsufficientRequest",
    ),
    pytest.param(
        [card("dev-0"), card("dev-1")],
        request(nums=3, cores=20),
        {},
        [],
        "2/2 AllocatedCardsInsufficientRequest",
        id="the insufficient count is the number of cards picked",
    ),
    pytest.param(
        [card("dev-0", used=20, usedcores=10)],
        request(memreq=0, pct=10, cores=20),
        {},
        ["dev-0"],
        "",
        id="a memory percentage of the card fits",
    ),
    pytest.param(
        [card("dev-0", used=20, usedcores=10, health=False)],
        request(memreq=0, pct=10, cores=20),
        {},
        [],
        "1/1 CardNotHealth",
        id="an unhealthy card is CardNotHealth",
    ),
]


@pytest.mark.parametrize(("devices", "req", "prefs", "want_ids", "want_reason"), CASE_11)
def test_fit_matches_hami_fit_table(
    devices: list[Any], req: DeviceRequest, prefs: dict[str, Any], want_ids: list[str], want_reason: str
) -> None:
    assert verdict(devices, req, ctx(**prefs)) == (want_ids, want_reason)


def test_fit_skips_cordoned_cards_and_picks_the_other() -> None:
    n = node("n", card("dev-0"), card("dev-1"), cordoned=frozenset({"dev-1"}))
    assert verdict(list(n.devices), request(), ctx(n)) == (["dev-0"], "")


def test_fit_rejects_node_whose_every_card_is_cordoned() -> None:
    n = node("n", card("dev-0"), card("dev-1"), cordoned=frozenset({"dev-0", "dev-1"}))
    assert verdict(list(n.devices), request(), ctx(n)) == ([], "2/2 CardCordoned")


def test_fit_with_numa_bind_keeps_all_cards_on_one_numa_node() -> None:
    devices = [card("dev-0", numa=1), card("dev-1", numa=1), card("dev-2", numa=0)]
    assert verdict(devices, request(nums=2), ctx(numa_bind=True)) == (["dev-1", "dev-0"], "")


def test_fit_with_numa_bind_counts_numa_not_fit_for_cards_dropped_at_a_numa_change() -> None:
    devices = [card("dev-0", numa=1), card("dev-1", numa=0), card("dev-2", numa=0)]
    fit = NVIDIA.fit(devices, request(nums=3), ctx(numa_bind=True))
    assert not fit.fits
    assert fit.rejected == {Reason.NUMA_NOT_FIT: 2, Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: 1}


def test_mutex_policy_picks_the_idle_card() -> None:
    devices = [card("idle"), card("used", used=1)]
    assert verdict(devices, request(), ctx(gpu_policy="mutex")) == (["idle"], "")


def test_mutex_policy_refuses_two_cards_when_one_is_in_use() -> None:
    devices = [card("idle"), card("used", used=1)]
    ids, reason = verdict(devices, request(nums=2), ctx(gpu_policy="mutex"))
    assert ids == []
    assert "1/2 ExclusiveDeviceAllocateConflict" in reason


def test_type_filters_match_case_insensitive_substrings() -> None:
    devices = [card("a100", type="NVIDIA A100-SXM4-80GB"), card("a10", type="NVIDIA A10")]
    assert verdict(devices, request(), ctx(use_types=("a10",), nouse_types=("A100",))) == (["a10"], "")
    assert verdict(devices, request(), ctx(nouse_types=("NVIDIA",))) == ([], "2/2 CardTypeMismatch")


def test_vgpu_mode_keeps_cards_whose_mode_the_annotation_names() -> None:
    devices = [card("core"), card("mig", mode="mig")]
    assert verdict(devices, request(), ctx(vgpu_mode="hami-core")) == (["core"], "")


def test_quota_refuses_a_card_that_would_exceed_the_namespace_memory_limit() -> None:
    quota = NamespaceQuota(memory_limit=2000, used_memory=1600)
    c = FitContext(prefs=PodPreferences(), node=node("n"), quota=quota)
    assert verdict([card("dev-0")], request(memreq=512), c) == ([], "1/1 ResourceQuotaNotFit")
    assert verdict([card("dev-0")], request(memreq=400), c) == (["dev-0"], "")


def test_fit_grants_the_vendor_word_and_the_clamped_cores() -> None:
    fit = NVIDIA.fit([card("dev-0", type="NVIDIA-Tesla P4")], request(memreq=100, cores=150), ctx())
    assert [(d.uuid, d.type, d.usedmem, d.usedcores) for d in fit.devices] == [("dev-0", "NVIDIA", 100, 100)]
