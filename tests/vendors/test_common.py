"""The walk, handshake and request parsing the non-NVIDIA families share (hami-vendors §0.2)."""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_common.annotations.devices import ContainerDevice
from hami_common.errors import InvalidInput
from hami_common.resources import ContainerResources
from hami_common.scheduling.policy import PodPreferences
from hami_common.scheduling.reason import Reason, render_reasons
from hami_common.scheduling.usage import DeviceUsage, NodeUsage
from hami_common.scheduling.vendor import ContainerFit, FitContext
from hami_common.vendors._common import (
    add_resource_usage,
    allocatable_count,
    count,
    device_request,
    family_preferences,
    fit_walk,
    handshake_verdict,
    type_filter,
    walk,
    whole_number,
)

W = "XPU"


def card(i: int, **kw: object) -> DeviceUsage:
    base: dict[str, object] = {"id": f"dev-{i}", "index": i, "count": 4, "totalmem": 1024, "totalcore": 100, "type": W}
    base.update(kw)
    return DeviceUsage(**base)  # type: ignore[arg-type]


def ctx(devices: tuple[DeviceUsage, ...] = (), prefs: PodPreferences | None = None) -> FitContext:
    return FitContext(prefs=prefs or PodPreferences(), node=NodeUsage("n", devices))


def reasons(fit: ContainerFit) -> str:
    return render_reasons(fit.rejected, fit.checked)


def test_walk_takes_cards_from_the_end_of_the_list() -> None:
    devs = (card(0), card(1), card(2))
    fit = fit_walk(devs, device_request(2, W, 100, 10), ctx(devs), word=W)
    assert [d.uuid for d in fit.devices] == ["dev-2", "dev-1"]
    assert fit.devices[0] == ContainerDevice("dev-2", W, 100, 10)


def test_partial_pick_counts_the_cards_picked() -> None:
    devs = (card(0, health=False), card(1))
    fit = fit_walk(devs, device_request(2, W, 100, 10), ctx(devs), word=W)
    assert not fit.fits
    assert reasons(fit) == "1/2 AllocatedCardsInsufficientRequest, 1/2 CardNotHealth"


def test_collect_all_returns_every_passing_card_in_walk_order() -> None:
    devs = (card(0), card(1, used=4), card(2))
    found = walk(devs, device_request(1, W, 100, 0), ctx(devs), word=W, collect_all=True)
    assert [d.uuid for d in found.candidates] == ["dev-2", "dev-0"]
    assert found.rejected == {Reason.CARD_TIME_SLICING_EXHAUSTED: 1}
    assert [d.uuid for d in found.finish(1).devices] == ["dev-2"]
    assert reasons(found.finish(3)) == "1/3 CardTimeSlicingExhausted, 2/3 AllocatedCardsInsufficientRequest"


def test_whole_card_request_takes_all_memory_and_clamps_cores() -> None:
    devs = (card(0),)
    fit = fit_walk(devs, device_request(1, W, 0, 150), ctx(devs), word=W)
    assert fit.devices == (ContainerDevice("dev-0", W, 1024, 100),)


def test_type_mismatch_when_request_is_not_the_family_word() -> None:
    devs = (card(0),)
    fit = fit_walk(devs, device_request(1, "Other", 100, 0), ctx(devs), word=W)
    assert reasons(fit) == "1/1 CardTypeMismatch"


def test_type_hook_rejects_a_card() -> None:
    devs = (card(0),)
    fit = fit_walk(devs, device_request(1, W, 100, 0), ctx(devs), word=W, type_ok=lambda d: False)
    assert reasons(fit) == "1/1 CardTypeMismatch"


def test_use_uuid_list_decides_alone_and_nouse_applies_without_it() -> None:
    devs = (card(0), card(1))
    prefs = family_preferences(PodPreferences(), {"u": "dev-0", "nu": "dev-0"}, use_uuid="u", nouse_uuid="nu")
    fit = fit_walk(devs, device_request(1, W, 100, 0), ctx(devs, prefs), word=W)
    assert [d.uuid for d in fit.devices] == ["dev-0"]
    prefs = family_preferences(PodPreferences(), {"nu": " dev-1 , "}, use_uuid="u", nouse_uuid="nu")
    fit = fit_walk(devs, device_request(2, W, 100, 0), ctx(devs, prefs), word=W)
    assert reasons(fit) == "1/2 AllocatedCardsInsufficientRequest, 1/2 CardUuidMismatch"


def test_family_preferences_ignore_nvidia_keys() -> None:
    base = PodPreferences(use_uuids=("gpu-1",), nouse_types=("A100",), gpu_policy="mutex")
    prefs = family_preferences(base, {}, use_uuid="u", nouse_uuid="nu")
    assert (prefs.use_uuids, prefs.nouse_types, prefs.mutex) == ((), (), True)


def test_mutex_policy_refuses_a_used_card() -> None:
    devs = (card(0, used=1),)
    fit = fit_walk(devs, device_request(1, W, 10, 0), ctx(devs, PodPreferences(gpu_policy="mutex")), word=W)
    assert reasons(fit) == "1/1 ExclusiveDeviceAllocateConflict"


def test_total_core_hook_changes_the_core_checks() -> None:
    devs = (card(0, totalcore=20),)
    req = device_request(1, W, 10, 50)
    assert reasons(fit_walk(devs, req, ctx(devs), word=W)) == "1/1 CardInsufficientCore"
    found = walk(devs, req, ctx(devs), word=W, total_core=lambda d: 100)
    assert [d.uuid for d in found.finish(1).devices] == ["dev-0"]


def test_add_resource_usage_books_one_user_its_memory_and_cores() -> None:
    dev = add_resource_usage(card(0, used=1, usedmem=10, usedcores=5), ContainerDevice("dev-0", W, 100, 20))
    assert (dev.used, dev.usedmem, dev.usedcores) == (2, 110, 25)


def test_type_filter_substring_case_insensitive() -> None:
    assert type_filter("DCU-K100_AI", ("k100",), ())
    assert not type_filter("DCU-K100_AI", ("z100",), ())
    assert not type_filter("DCU-K100_AI", (), ("K100",))


# --- handshake ---

NOW = datetime(2025, 6, 1, 12, 0, 0)


@pytest.mark.parametrize(
    ("value", "allocatable", "expected"),
    [
        ("Requesting_2025-06-01 11:59:30", 0, (True, False, None)),  # within 60 s
        ("Requesting_2025-06-01 11:58:00", 2, (True, False, None)),  # stale but the plugin serves
        ("Requesting_2025-06-01 11:58:00", 0, (False, False, None)),  # stale, nothing served
        ("Reported 2025-06-01 11:59:59", 0, (True, True, "Requesting_2025-06-01 12:00:00")),
        (None, 0, (True, True, "Requesting_2025-06-01 12:00:00")),
    ],
)
def test_handshake_verdict(value: str | None, allocatable: int, expected: tuple[bool, bool, str | None]) -> None:
    out = handshake_verdict("hami.io/node-handshake-x", value, NOW, allocatable)
    assert (out.healthy, out.need_update, out.patch) == expected


def test_no_handshake_key_is_always_healthy_and_refreshed() -> None:
    out = handshake_verdict(None, "Requesting_2000-01-01 00:00:00", NOW, 0)
    assert (out.healthy, out.need_update, out.patch) == (True, True, None)


def test_allocatable_count() -> None:
    assert allocatable_count({"x/n": "4"}, "x/n") == 4
    assert allocatable_count({"x/n": "junk"}, "x/n") == 0
    assert allocatable_count({}, "x/n") == 0


def test_handshake_after_expiry_boundary() -> None:
    stamp = (NOW - timedelta(seconds=60)).strftime("Requesting_%Y-%m-%d %H:%M:%S")
    assert not handshake_verdict("k", stamp, NOW, 0).healthy


# --- request parsing ---


def test_count_from_limits_else_requests() -> None:
    assert count(ContainerResources("c", limits={"x/n": "2"}, requests={"x/n": "3"}), "x/n") == 2
    assert count(ContainerResources("c", requests={"x/n": "3"}), "x/n") == 3
    assert count(ContainerResources("c", limits={"x/n": "0"}), "x/n") is None
    assert count(ContainerResources("c"), "x/n") is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("1500m", "it is not a whole number"),
        (str(2**31), "it is too large"),
        ("-1", "it is negative"),
        ("two", "it is not a quantity"),
    ],
)
def test_a_count_that_cannot_be_read_is_refused_by_name_never_read_as_not_asking(text: str, why: str) -> None:
    with pytest.raises(InvalidInput) as err:
        count(ContainerResources("c", limits={"x/n": text}), "x/n")
    assert str(err.value) == (
        f"invalid x/n value {text!r} in container c: {why}; it must be a whole number from 0 to 2147483647"
    )


def test_whole_number_ranges_and_scales() -> None:
    c = ContainerResources("c", limits={"m": "16Gi", "f": "1.5", "n": "-1", "ok": "7"})
    assert whole_number(c, "ok") == 7
    assert whole_number(c, "absent") is None
    assert whole_number(ContainerResources("c", limits={"u": "8388607"}), "u", scale=256) == 8388607
    for name, why in (("m", "too large"), ("f", "not a whole number"), ("n", "negative")):
        with pytest.raises(InvalidInput, match=why):
            whole_number(c, name)
    # 8388608 units of 256 MiB is 2³¹ MiB: past int32 once scaled, and the message gives the range unscaled
    with pytest.raises(InvalidInput, match=r"from 0 to 8388607$"):
        whole_number(ContainerResources("c", limits={"u": "8388608"}), "u", scale=256)


def test_device_request_percentage() -> None:
    assert device_request(1, W, 0, 5).mem_percentage == 100
    assert device_request(1, W, 64, 5).mem_percentage == 0


@given(st.text(max_size=40))
def test_request_parsing_never_crashes(text: str) -> None:
    c = ContainerResources("c", limits={"x/n": text, "x/m": text})
    with contextlib.suppress(InvalidInput):
        count(c, "x/n")
    with contextlib.suppress(InvalidInput):
        whole_number(c, "x/m")
