"""Mixed clusters (issue 20, Deliver 6): one engine fits NVIDIA and the other device families side by side.

A node here carries NVIDIA cards, Ascend 910B3 NPUs and Hygon DCUs; the families are the real ones from
:mod:`hami_common.vendors`, and requests come from pod resources through ``pod_request``, as the extender
builds them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from hami_common.resources import ContainerResources, PodRequest, ResourceConfig, pod_request
from hami_common.scheduling import (
    DEFAULT_VENDORS,
    DeviceUsage,
    NamespaceQuota,
    NodeFit,
    NodePolicy,
    NodeUsage,
    PodFamilies,
    PodPreferences,
    Reason,
    choose_node,
    fit_node,
    render_reasons,
)
from hami_common.vendors import DeviceFamily
from hami_common.vendors.ascend import CHART_CHIPS, AscendFamily
from hami_common.vendors.cambricon import CambriconFamily
from hami_common.vendors.hygon import HygonFamily
from tests.scheduling.builders import card

B3 = AscendFamily(chip=next(c for c in CHART_CHIPS if c.common_word == "Ascend910B3"))
C910 = AscendFamily(chip=next(c for c in CHART_CHIPS if c.common_word == "Ascend910C"))
DCU = HygonFamily()
MLU = CambriconFamily()
FAMILIES: tuple[DeviceFamily, ...] = (B3, C910, DCU, MLU)
NVIDIA = ResourceConfig()


def npu(id: str, index: int = 0, network: int | None = 0, word: str = "Ascend910B3", **kw: Any) -> DeviceUsage:
    fields: dict[str, Any] = {"count": 4, "totalmem": 65536, "totalcore": 20, "mode": "template"}
    fields.update(kw)
    return DeviceUsage(id=id, index=index, type=word, network_id=network, **fields)


def dcu(id: str, index: int = 0, **kw: Any) -> DeviceUsage:
    fields: dict[str, Any] = {"count": 4, "totalmem": 16384, "totalcore": 100}
    fields.update(kw)
    return DeviceUsage(id=id, index=index, type="DCU-Z100", **fields)


def mlu(id: str, index: int = 0, **kw: Any) -> DeviceUsage:
    fields: dict[str, Any] = {"count": 100, "totalmem": 24576, "totalcore": 100}
    fields.update(kw)
    return DeviceUsage(id=id, index=index, type="MLU", **fields)


def mixed(name: str = "mixed") -> NodeUsage:
    return NodeUsage(
        name=name,
        devices=(
            card("GPU-0", totalmem=16000),
            card("GPU-1", index=1, totalmem=16000),
            npu("NPU-0"),
            npu("NPU-1", index=1),
            dcu("DCU-0"),
            dcu("DCU-1", index=1),
        ),
    )


def asks(*containers: Mapping[str, str], init: Sequence[Mapping[str, str]] = ()) -> PodRequest:
    app = [ContainerResources(name=f"c{i}", limits=dict(c)) for i, c in enumerate(containers)]
    inits = [ContainerResources(name=f"i{i}", limits=dict(c)) for i, c in enumerate(init)]
    return pod_request(inits, app, NVIDIA, FAMILIES)


def plan(request: PodRequest, annotations: Mapping[str, str] | None = None) -> PodFamilies:
    """What the extender's Families.plan gives: every family's fit, the asked ones' prefs and scorers."""
    asked = {r.type for c in request.families for r in c}
    used = [f for f in FAMILIES if f.word in asked]
    base = PodPreferences()
    return PodFamilies(
        vendors={**DEFAULT_VENDORS, **{f.word: f for f in FAMILIES}},
        prefs={f.word: f.preferences(base, annotations or {}) for f in used},
        scorers=tuple(used),
    )


def fit(node: NodeUsage, request: PodRequest, **kw: Any) -> NodeFit:
    return fit_node(node, request, PodPreferences(), families=plan(request), **kw)


GPU_SLICE = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}
VNPU = {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "16384"}
DCU_SLICE = {"hygon.com/dcunum": "1", "hygon.com/dcumem": "4000"}


def uuids(nf: NodeFit) -> list[list[str]]:
    return [[g.uuid for g in c] for c in nf.grants]


# --- requests ----------------------------------------------------------------------------------------------


def test_a_pod_asking_nvidia_alone_is_the_same_request_with_or_without_families() -> None:
    app = [ContainerResources(name="c", limits=GPU_SLICE)]
    assert pod_request([], app, NVIDIA, FAMILIES) == pod_request([], app, NVIDIA)
    assert pod_request([], app, NVIDIA, FAMILIES).families == ()


def test_a_container_asking_nvidia_and_dcu_carries_both_requests_nvidia_first() -> None:
    request = asks({**GPU_SLICE, **DCU_SLICE}, {"cpu": "1"}, init=[VNPU])
    assert [r.type for r in request.requests(0)] == ["Ascend910B3"]
    assert [(r.type, r.memreq) for r in request.requests(1)] == [("NVIDIA", 4000), ("DCU", 4000)]
    assert request.requests(2) == ()
    assert request.has_devices


def test_a_pod_asking_only_a_family_has_devices_but_no_nvidia_request() -> None:
    request = asks(VNPU)
    assert request.containers == (None,)
    assert request.has_devices


# --- placement on a mixed node -----------------------------------------------------------------------------


def test_an_nvidia_slice_lands_on_nvidia_cards_only() -> None:
    nf = fit(mixed(), asks(GPU_SLICE))
    assert nf.fits
    assert uuids(nf) == [["GPU-1"]] or uuids(nf) == [["GPU-0"]]
    assert all(g.type == "NVIDIA" for c in nf.grants for g in c)


def test_an_ascend_vnpu_lands_on_an_npu_with_the_template_memory() -> None:
    nf = fit(mixed(), asks(VNPU))
    assert nf.fits
    [[grant]] = nf.grants
    assert grant.uuid.startswith("NPU-")
    assert grant.type == "Ascend910B3"
    assert grant.usedmem == 16384


def test_one_container_asking_nvidia_and_dcu_gets_both() -> None:
    nf = fit(mixed(), asks({**GPU_SLICE, **DCU_SLICE}))
    assert nf.fits
    [[first, second]] = nf.grants
    assert (first.type, second.type) == ("NVIDIA", "DCU")
    assert first.uuid.startswith("GPU-")
    assert second.uuid.startswith("DCU-")
    assert {c.uuid for c in nf.charges} == {first.uuid, second.uuid}


def test_app_containers_of_different_families_accumulate_on_their_own_devices() -> None:
    whole_dcu = {"hygon.com/dcunum": "1", "hygon.com/dcucores": "100"}
    nf = fit(mixed(), asks(whole_dcu, whole_dcu, GPU_SLICE))
    assert nf.fits
    dcus = [c[0].uuid for c in nf.grants[:2]]
    assert sorted(dcus) == ["DCU-0", "DCU-1"]  # the first DCU is taken whole: the second goes elsewhere
    assert not fit(mixed(), asks(whole_dcu, whole_dcu, whole_dcu)).fits


def test_a_family_pod_on_a_node_without_that_family_is_told_the_node_lacks_devices() -> None:
    gpu_only = NodeUsage(name="gpu", devices=(card("GPU-0"),))
    nf = fit(gpu_only, asks(VNPU))
    assert not nf.fits
    assert nf.reason == "NodeInsufficientDevice"


def test_without_the_family_configured_its_request_finds_no_device_type() -> None:
    request = asks(VNPU)
    nf = fit_node(mixed(), request, PodPreferences())  # NVIDIA's engine alone
    assert nf.reason == "Device type not found"


# --- reasons -----------------------------------------------------------------------------------------------


def test_a_mixed_container_is_refused_with_the_reasons_of_the_family_that_did_not_fit() -> None:
    too_big_dcu = {"hygon.com/dcunum": "1", "hygon.com/dcumem": "20000"}
    nf = fit(mixed(), asks({**GPU_SLICE, **too_big_dcu}))
    assert nf.reason == "2/2 CardInsufficientMemory"
    too_big_gpu = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}
    nf = fit(mixed(), asks({**too_big_gpu, **DCU_SLICE}))
    assert nf.reason == "2/2 CardInsufficientMemory"
    assert fit(mixed(), asks({**GPU_SLICE, **DCU_SLICE})).fits


def test_a_dcu_use_type_filter_reads_the_families_own_annotation() -> None:
    request = asks(DCU_SLICE)
    families = plan(request, {"hygon.com/use-dcutype": "K100"})
    nf = fit_node(mixed(), request, PodPreferences(), families=families)
    assert nf.reason == "2/2 CardTypeMismatch"


def test_an_unpaired_910c_request_renders_zero_of_the_request_as_hami_does() -> None:
    # 910C NPUs pair as modules (index // 2): indexes 0 and 2 sit on two different modules
    node = NodeUsage(
        name="c", devices=(npu("C-0", 0, word="Ascend910C", network=0), npu("C-2", 2, word="Ascend910C", network=0))
    )
    nf = fit(node, asks({"huawei.com/Ascend910C": "2"}))
    assert not nf.fits
    assert nf.rejected == {Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: 0}
    assert nf.reason == "0/2 AllocatedCardsInsufficientRequest"


def test_zero_counts_of_other_reasons_are_still_left_out() -> None:
    assert render_reasons({Reason.CARD_INSUFFICIENT_MEMORY: 0, Reason.CARD_NOT_HEALTH: 1}, 2) == "1/2 CardNotHealth"


# --- node score --------------------------------------------------------------------------------------------


def _npu_node(name: str, networks: tuple[int, int]) -> NodeUsage:
    return NodeUsage(name=name, devices=(npu(f"{name}-0", 0, networks[0]), npu(f"{name}-1", 4, networks[1])))


@pytest.mark.parametrize(
    ("scored", "expected"),
    [
        pytest.param(True, "grouped", id="the Ascend 910 grouping bonus picks the node whose NPUs share an HCCS group"),
        pytest.param(False, "split", id="without the bonus the equal nodes tie and the last listed wins"),
    ],
)
def test_the_ascend_node_bonus_changes_the_chosen_node(scored: bool, expected: str) -> None:
    request = asks({"huawei.com/Ascend910B3": "2"})
    families = plan(request)
    if not scored:
        families = PodFamilies(vendors=families.vendors, prefs=families.prefs)
    fits = [
        fit_node(n, request, PodPreferences(), families=families)
        for n in (_npu_node("grouped", (0, 0)), _npu_node("split", (0, 1)))
    ]
    assert all(f.fits for f in fits)
    chosen = choose_node(fits, NodePolicy.BINPACK)
    assert chosen is not None
    assert chosen.node == expected
    if scored:
        assert fits[0].score - fits[1].score == pytest.approx(5.0)  # 10 × (2/2 - 1/2)


def test_an_nvidia_pod_gets_no_family_bonus() -> None:
    node = mixed()
    assert fit(node, asks(GPU_SLICE)).score == fit_node(node, asks(GPU_SLICE), PodPreferences()).score


# --- quota -------------------------------------------------------------------------------------------------


def test_cambricon_checks_its_own_quota_in_256_mib_units_and_nvidia_its_own() -> None:
    node = NodeUsage(name="m", devices=(mlu("MLU-0"), card("GPU-0", totalmem=16000)))
    whole_mlu = asks({"cambricon.com/vmlu": "1"})
    tight = {"MLU": NamespaceQuota(memory_limit=50)}  # 50 × 256 = 12800 MiB < 24576
    assert fit(node, whole_mlu, quotas=tight).reason == "1/1 ResourceQuotaNotFit"
    assert fit(node, whole_mlu, quotas={"MLU": NamespaceQuota(memory_limit=96)}).fits
    # NVIDIA's quota is not applied to MLU memory, nor the MLU quota to NVIDIA cards
    assert fit(node, whole_mlu, quota=NamespaceQuota(memory_limit=1)).fits
    assert fit(node, asks(GPU_SLICE), quotas=tight).fits
    assert not fit(node, asks(GPU_SLICE), quota=NamespaceQuota(memory_limit=1)).fits


def test_a_mixed_pods_nvidia_quota_counts_its_nvidia_cards_only() -> None:
    node = NodeUsage(name="m", devices=(mlu("MLU-0"), card("GPU-0", totalmem=16000), card("GPU-1", index=1)))
    request = asks({"cambricon.com/vmlu": "1"}, GPU_SLICE)
    assert fit(node, request, quota=NamespaceQuota(memory_limit=4000)).fits
    assert not fit(node, request, quota=NamespaceQuota(memory_limit=3999)).fits
