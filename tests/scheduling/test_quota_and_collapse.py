"""Namespace quota, init-container collapsing and reason rendering (§4.7-4.9, §8 cases 23, 24, 26)."""

from __future__ import annotations

import pytest

from hami_common.annotations.devices import ContainerDevice
from hami_common.scheduling import NamespaceQuota, PodPreferences, Reason, collapse_devices, fit_node, quota_from_hard
from hami_common.scheduling.reason import render_reasons
from tests.scheduling.builders import card, mib, node, pod

QUOTA = NamespaceQuota(memory_limit=2000, used_memory=1000)


@pytest.mark.parametrize(
    ("request_pod", "fits"),
    [
        pytest.param(pod(mib(1, 100)), True, id="100 MiB under a 1000 MiB headroom fits"),
        pytest.param(pod(mib(1, 1024)), False, id="1024 MiB over the headroom is refused"),
        pytest.param(pod(mib(2, 1024)), False, id="two cards of 1024 MiB are refused"),
        pytest.param(pod(mib(2, 400)), True, id="two cards of 400 MiB fit"),
        pytest.param(
            pod(mib(1, 500), init=(mib(1, 800), mib(1, 800))),
            True,
            id="init containers count at their peak, not their sum",
        ),
    ],
)
def test_quota_fit_matches_hami(request_pod: object, fits: bool) -> None:
    n = node("n", card("a", totalmem=8000), card("b", totalmem=8000))
    fit = fit_node(n, request_pod, PodPreferences(), quota=QUOTA)  # type: ignore[arg-type]
    assert fit.fits is fits
    if not fits:
        assert Reason.RESOURCE_QUOTA_NOT_FIT in fit.rejected


def test_memory_quota_scales_with_memory_factor_above_one() -> None:
    assert QUOTA.fits(1500, 0, memory_factor=2)
    assert not QUOTA.fits(1500, 0, memory_factor=1)


def test_an_explicit_zero_limit_blocks_everything_and_no_limit_passes() -> None:
    assert not NamespaceQuota(memory_limit=0).fits(1, 0)
    assert NamespaceQuota().fits(10**9, 10**9)


def test_quota_limits_read_only_integer_gpu_limits() -> None:
    hard = {"limits.nvidia.com/gpumem": "2000", "limits.nvidia.com/gpucores": "1.5", "requests.cpu": "4"}
    assert quota_from_hard([hard]) == NamespaceQuota(memory_limit=2000, cores_limit=None)


def dev(uuid: str, mem: int, cores: int) -> ContainerDevice:
    return ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=mem, usedcores=cores)


def test_collapse_takes_the_init_peak_when_it_is_larger() -> None:
    charges = collapse_devices([[dev("g", 1000, 80)]], [[dev("g", 200, 20)]])
    assert [(c.uuid, c.usedmem, c.usedcores, c.slots) for c in charges] == [("g", 1000, 80, 1)]


def test_collapse_sums_app_containers_sharing_a_card() -> None:
    charges = collapse_devices([[dev("g", 100, 10)]], [[dev("g", 200, 20)], [dev("g", 300, 30)]])
    assert [(c.usedmem, c.usedcores, c.slots) for c in charges] == [(500, 50, 2)]


def test_collapse_counts_one_slot_per_app_container() -> None:
    charges = collapse_devices([], [[dev("g", 1, 1)]] * 3)
    assert charges[0].slots == 3


def test_collapse_sorts_by_uuid() -> None:
    assert [c.uuid for c in collapse_devices([], [[dev("z", 1, 1), dev("a", 1, 1)]])] == ["a", "z"]


def test_reasons_render_as_sorted_count_over_total_entries() -> None:
    counts = {Reason.CARD_INSUFFICIENT_MEMORY: 3, Reason.CARD_INSUFFICIENT_CORE: 2, Reason.CARD_NOT_HEALTH: 3}
    assert render_reasons(counts, 8) == "2/8 CardInsufficientCore, 3/8 CardInsufficientMemory, 3/8 CardNotHealth"


def test_reason_words_are_hamis_wire_words() -> None:
    assert str(Reason.CARD_UUID_MISMATCH) == "CardUuidMismatch"
    assert str(Reason.NODE_UNREGISTERED) == "node unregistered"
