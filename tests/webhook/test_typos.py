"""Typos named at admission, beyond HAMi (issue 31 item 4): the pure warning function, then the webhook over
real HTTPS. HAMi ignores an unknown annotation or resource and reads a value outside a key's vocabulary as a
default; the webhook answers such a pod with ``response.warnings`` and admits it exactly as before."""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Iterator, Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_common.annotations import (
    BINPACK,
    GPU_POLICIES,
    GPU_SCHEDULER_POLICY,
    NODE_SCHEDULER_POLICY,
    NUMA_BIND,
    USE_GPUTYPE,
    USE_GPUUUID,
    USER_POD_ANNOTATIONS,
    VGPU_MODE,
    VGPU_MODES,
)
from hami_common.deviceconfig import parse_device_config
from hami_common.resources import GPU, GPU_CORES, GPU_MEMORY, ContainerResources, ResourceConfig
from hami_common.vendors import device_families
from hami_common.vendors.ascend.keys import VNPU_MODE, use_uuid_key
from hami_common.vendors.hygon.keys import DCU_MEMORY, USE_DCUTYPE
from hami_webhook.typos import (
    MAX_SHOWN,
    MAX_WARNING_CHARS,
    MAX_WARNINGS,
    MORE_LEFT_OUT,
    KnownNames,
    known_names,
    typo_warnings,
)
from tests.webhook.conftest import TlsFiles, offline_settings
from tests.webhook.support import ServedWebhook, container, patch_ops, pod, review, served

ALL_FAMILIES = "vnpus:\n  enabled: true\ncambricon: {}\nhygon: {}\n"
NVIDIA_ONLY: KnownNames = known_names(device_families())
WITH_FAMILIES: KnownNames = known_names(device_families(others=parse_device_config(ALL_FAMILIES).families))
GPU_POLICY_LIST = ", ".join(GPU_POLICIES)
VGPU_MODE_LIST = ", ".join(VGPU_MODES)


def warned(
    annotations: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
    requests: Mapping[str, str] | None = None,
    known: KnownNames = NVIDIA_ONLY,
) -> tuple[str, ...]:
    ctr = ContainerResources("main", dict(limits or {}), dict(requests or {}))
    return typo_warnings(dict(annotations or {}), [ctr], known)


# --- the typo table (also run on the real kube-apiserver: tests/realk8s/test_typo_warnings.py) -------------

TYPO_TABLE = [
    pytest.param(
        {"nvidia.com/use-gputyp": "A100"},
        {},
        "unknown annotation nvidia.com/use-gputyp; did you mean nvidia.com/use-gputype?",
        id="a misspelt use-gputype names the key it meant",
    ),
    pytest.param(
        {GPU_SCHEDULER_POLICY: "binpak"},
        {},
        f"annotation {GPU_SCHEDULER_POLICY}: binpak is not one of {GPU_POLICY_LIST} (it is ignored); "
        f"did you mean {BINPACK}?",
        id="a gpu policy outside the vocabulary lists the accepted ones",
    ),
    pytest.param(
        {VGPU_MODE: "MIG"},
        {},
        f"annotation {VGPU_MODE}: MIG is not one of {VGPU_MODE_LIST} (no card's mode matches it); did you mean mig?",
        id="vgpu-mode is case sensitive as in HAMi",
    ),
    pytest.param(
        {},
        {"nvidia.com/gpumemory": "1024"},
        f"unknown resource nvidia.com/gpumemory in container main; did you mean {GPU_MEMORY}?",
        id="a misspelt resource names the resource it meant",
    ),
]


@pytest.mark.parametrize(("annotations", "limits", "expected"), TYPO_TABLE)
def test_each_typo_of_the_table_gets_one_warning(
    annotations: dict[str, str], limits: dict[str, str], expected: str
) -> None:
    assert warned(annotations, {GPU: "1", **limits}) == (expected,)


@pytest.mark.parametrize(
    ("annotations", "limits"),
    [
        pytest.param({}, {GPU: "1", GPU_MEMORY: "1024", GPU_CORES: "30"}, id="a plain gpu pod"),
        pytest.param(
            {USE_GPUTYPE: "A100,H100", GPU_SCHEDULER_POLICY: "binpack, numa", NODE_SCHEDULER_POLICY: "spread"},
            {GPU: "1"},
            id="every user key with a good value, a chain trimmed as HAMi trims it",
        ),
        pytest.param({GPU_SCHEDULER_POLICY: "topology-aware"}, {GPU: "1"}, id="topology-aware"),
        pytest.param({VGPU_MODE: "hami-core,mig"}, {GPU: "1"}, id="a vgpu-mode naming both modes"),
        pytest.param({GPU_SCHEDULER_POLICY: "", VGPU_MODE: ""}, {GPU: "1"}, id="empty values are unset"),
        pytest.param({"example.com/use-gputyp": "x", "use-gputyp": "x"}, {GPU: "1"}, id="another domain or none"),
        pytest.param({}, {GPU: "1", "nvidia.com/gpu.shared": "1"}, id="the time-slicing resource is not a typo"),
        pytest.param({}, {"nvidia.com/mig-1g.5gb": "1"}, id="a MIG-strategy resource is not a typo"),
        pytest.param(
            {"hami.io/metax-sgpu-devices-allocated": "x"},
            {GPU: "1"},
            id="a key only a system writes is never suggested",
        ),
        pytest.param({"cpu": "1", "memory": "1Gi"}, {"cpu": "1"}, id="core resources"),
    ],
)
def test_a_pod_without_a_typo_gets_no_warning(annotations: dict[str, str], limits: dict[str, str]) -> None:
    assert warned(annotations, limits) == ()


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        pytest.param(
            {"nvidia.com/USE-GPUTYPE": "A100"},
            f"unknown annotation nvidia.com/USE-GPUTYPE; did you mean {USE_GPUTYPE}?",
            id="a key in the wrong case",
        ),
        pytest.param(
            {"hami.io/gpu-schedular-policy": BINPACK},
            f"unknown annotation hami.io/gpu-schedular-policy; did you mean {GPU_SCHEDULER_POLICY}?",
            id="a misspelt policy key",
        ),
        pytest.param(
            {NODE_SCHEDULER_POLICY: "Spread"},
            f"annotation {NODE_SCHEDULER_POLICY}: Spread is not one of binpack, spread (it reads as binpack); "
            "did you mean spread?",
            id="a node policy in the wrong case reads as binpack",
        ),
        pytest.param(
            {GPU_SCHEDULER_POLICY: "binpack,nuam"},
            f"annotation {GPU_SCHEDULER_POLICY}: nuam is not one of {GPU_POLICY_LIST} (it is ignored); "
            "did you mean numa?",
            id="one bad part of a chain",
        ),
        pytest.param(
            {GPU_SCHEDULER_POLICY: "zzz"},
            f"annotation {GPU_SCHEDULER_POLICY}: zzz is not one of {GPU_POLICY_LIST} (it is ignored)",
            id="nothing close: the vocabulary alone",
        ),
    ],
)
def test_other_typos_of_keys_and_values(annotations: dict[str, str], expected: str) -> None:
    assert warned(annotations, {GPU: "1"}) == (expected,)


def test_a_resource_misspelt_in_limits_and_requests_is_named_once_per_container() -> None:
    ctrs = [
        ContainerResources("a", {"nvidia.com/gpucore": "10"}, {"nvidia.com/gpucore": "10"}),
        ContainerResources("b", {"nvidia.com/gpucore": "10"}),
    ]
    assert typo_warnings({}, ctrs, NVIDIA_ONLY) == (
        f"unknown resource nvidia.com/gpucore in container a; did you mean {GPU_CORES}?",
        f"unknown resource nvidia.com/gpucore in container b; did you mean {GPU_CORES}?",
    )


# --- the configured families' keys and resources ------------------------------------------------------------


def test_every_configured_familys_keys_and_resources_are_known() -> None:
    annotations = {use_uuid_key("Ascend910B3"): "x", VNPU_MODE: "hami-core", USE_DCUTYPE: "Z100"}
    assert warned(annotations, {"huawei.com/Ascend910B3": "1", DCU_MEMORY: "1000"}, known=WITH_FAMILIES) == ()


def test_a_familys_misspelt_key_and_resource_name_what_they_meant() -> None:
    assert warned({"hami.io/use-Ascend910B3-uid": "x"}, {"hygon.com/dcumemory": "1000"}, known=WITH_FAMILIES) == (
        f"unknown annotation hami.io/use-Ascend910B3-uid; did you mean {use_uuid_key('Ascend910B3')}?",
        f"unknown resource hygon.com/dcumemory in container main; did you mean {DCU_MEMORY}?",
    )


def test_without_families_their_domains_are_not_looked_at() -> None:
    assert warned({"hygon.com/use-dcutyp": "x"}, {"hygon.com/dcumemory": "1"}) == ()


def test_renamed_nvidia_resources_are_the_known_ones() -> None:
    renamed = known_names(device_families(ResourceConfig(memory_name="nvidia.com/vgpu-memory")))
    assert warned(limits={GPU: "1", "nvidia.com/vgpu-memory": "1"}, known=renamed) == ()
    assert warned(limits={GPU: "1", "nvidia.com/vgpu-memroy": "1"}, known=renamed) == (
        "unknown resource nvidia.com/vgpu-memroy in container main; did you mean nvidia.com/vgpu-memory?",
    )


def test_every_user_key_is_known() -> None:
    values = {GPU_SCHEDULER_POLICY: BINPACK, NODE_SCHEDULER_POLICY: BINPACK, VGPU_MODE: "mig", NUMA_BIND: "true"}
    assert warned({key: values.get(key, "x") for key in sorted(USER_POD_ANNOTATIONS)}) == ()


# --- bounded, whatever the tenant sends ------------------------------------------------------------------------


def test_many_typos_give_at_most_the_cap_and_say_more_were_left_out() -> None:
    annotations = {f"nvidia.com/use-gputyp{i}": "x" for i in range(1000)}
    found = warned(annotations)
    assert len(found) == MAX_WARNINGS
    assert found[-1] == MORE_LEFT_OUT
    assert all(w.startswith("unknown annotation nvidia.com/use-gputyp") for w in found[:-1])


def test_a_huge_annotation_map_is_answered_quickly() -> None:
    annotations = {f"nvidia.com/{'x' * (i % 300)}-{i}": "v" * 1000 for i in range(100_000)}
    annotations.update({f"hami.io/use-gputype-{i}": "x" for i in range(50_000)})
    started = time.monotonic()
    found = warned(annotations, {f"nvidia.com/gpumem{i}": "1" for i in range(50_000)})
    assert time.monotonic() - started < 2.0
    assert len(found) <= MAX_WARNINGS


def test_a_long_key_or_value_is_cut() -> None:
    found = warned({GPU_SCHEDULER_POLICY: "b" * 10_000, "nvidia.com/use-gputype" + "e" * 3: "x"})
    assert found[0].startswith(f"annotation {GPU_SCHEDULER_POLICY}: {'b' * MAX_SHOWN}… is not one of")
    assert all(len(w) <= MAX_WARNING_CHARS for w in found)


@pytest.mark.parametrize(
    "value",
    ["hami\ncore", "hami-kore\x1b[31m", "mi\u202eg", "\u0000", " MIG"],
    ids=["newline", "terminal escape", "bidi override", "nul", "leading space"],
)
def test_a_value_with_control_or_invisible_characters_is_shown_escaped(value: str) -> None:
    (found,) = warned({VGPU_MODE: value})
    assert all(unicodedata.category(ch) not in ("Cc", "Cf") for ch in found), found
    assert f"annotation {VGPU_MODE}: {value!r} is not one of" in found


def _no_control_characters(text: str) -> bool:
    """kube-apiserver drops a warning with a control character (Go's unicode.IsControl: category Cc)."""
    return all(unicodedata.category(ch) != "Cc" for ch in text)


keys = st.one_of(
    st.text(max_size=40),
    st.builds(lambda d, r: f"{d}/{r}", st.sampled_from(["nvidia.com", "hami.io", "huawei.com", "x"]), st.text()),
    st.sampled_from([*sorted(USER_POD_ANNOTATIONS), "nvidia.com/use-gputyp", "hami.io/gpu-scheduler-polic"]),
)
maps = st.dictionaries(keys, st.text(max_size=30), max_size=40)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(annotations=maps, limits=maps, requests=maps, families=st.booleans())
def test_any_pod_gets_a_bounded_answer_of_printable_warnings(
    annotations: dict[str, str], limits: dict[str, str], requests: dict[str, str], families: bool
) -> None:
    known = WITH_FAMILIES if families else NVIDIA_ONLY
    found = typo_warnings(annotations, [ContainerResources("c\n", limits, requests)], known)
    assert isinstance(found, tuple)
    assert len(found) <= MAX_WARNINGS
    assert len(set(found)) == len(found)
    for warning in found:
        assert 0 < len(warning) <= MAX_WARNING_CHARS
        assert _no_control_characters(warning), warning


@settings(max_examples=100, deadline=None)
@given(
    gpu_policy=st.lists(st.sampled_from(GPU_POLICIES), min_size=1, max_size=4).map(",".join),
    mode=st.sampled_from(VGPU_MODES),
    node_policy=st.sampled_from(["binpack", "spread"]),
)
def test_any_value_from_the_vocabularies_gets_no_warning(gpu_policy: str, mode: str, node_policy: str) -> None:
    annotations = {GPU_SCHEDULER_POLICY: gpu_policy, VGPU_MODE: mode, NODE_SCHEDULER_POLICY: node_policy}
    assert warned(annotations, {GPU: "1"}) == ()


# --- through the webhook, over HTTPS -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vendors(tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedWebhook]:
    path = tmp_path_factory.mktemp("typos") / "device-config.yaml"
    path.write_text(ALL_FAMILIES)
    with served(offline_settings(tls_files, device_config_file=str(path)), tls_files.cert) as running:
        yield running


TYPOS = {"nvidia.com/use-gputyp": "A100", GPU_SCHEDULER_POLICY: "binpak", VGPU_MODE: "MIG"}


def test_warnings_come_back_and_admission_is_unchanged(webhook: ServedWebhook) -> None:
    clean = webhook.admit(review(pod(container(limits={GPU: "1", GPU_MEMORY: "1024"}))))
    typo = webhook.admit(
        review(pod(container(limits={GPU: "1", GPU_MEMORY: "1024", "nvidia.com/gpumemory": "1"}), annotations=TYPOS))
    )
    assert "warnings" not in clean
    assert typo["warnings"] == [
        *(str(row.values[2]) for row in TYPO_TABLE[:3]),
        f"unknown resource nvidia.com/gpumemory in container main; did you mean {GPU_MEMORY}?",
    ]
    assert typo["allowed"] is clean["allowed"] is True
    assert typo["status"] == clean["status"]
    # the same patch: warnings change nothing the apiserver stores (the annotations are the pod's own)
    assert patch_ops(typo) == patch_ops(clean)


def test_a_refused_pod_carries_its_warnings_too(webhook: ServedWebhook) -> None:
    response = webhook.admit(
        review(pod(container(limits={GPU: "1"}, privileged=True), annotations={"nvidia.com/use-gputyp": "A100"}))
    )
    assert response["allowed"] is False
    assert response["status"]["message"] == "container main is privileged"
    assert response["warnings"] == ["unknown annotation nvidia.com/use-gputyp; did you mean nvidia.com/use-gputype?"]


def test_an_update_gets_no_warnings(webhook: ServedWebhook) -> None:
    sent = pod(container(limits={GPU: "1"}), annotations={"nvidia.com/use-gputyp": "A100"})
    response = webhook.admit(review(sent, operation="UPDATE", old=sent))
    assert response["allowed"] is True
    assert "warnings" not in response


def test_a_gpucores_past_100_is_refused_naming_the_range_with_the_typos(webhook: ServedWebhook) -> None:
    response = webhook.admit(
        review(pod(container(limits={GPU: "1", GPU_CORES: "150"}), annotations={VGPU_MODE: "MIG"}))
    )
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert response["status"]["message"] == (
        f"invalid {GPU_CORES} value '150' in container main: it is too large; it must be a whole number from 0 to 100"
    )
    assert len(response["warnings"]) == 1


def test_the_configured_families_count_as_known(vendors: ServedWebhook) -> None:
    known = pod(container(limits={"huawei.com/Ascend910B3": "1"}), annotations={use_uuid_key("Ascend910B3"): "x"})
    assert "warnings" not in vendors.admit(review(known))
    misspelt = pod(container(limits={"hygon.com/dcunum": "1", "hygon.com/dcumemory": "1000"}))
    assert vendors.admit(review(misspelt))["warnings"] == [
        f"unknown resource hygon.com/dcumemory in container main; did you mean {DCU_MEMORY}?"
    ]


def test_an_ephemeral_containers_resources_are_looked_at_too(webhook: ServedWebhook) -> None:
    sent = pod(container(limits={GPU: "1"}))
    sent["spec"]["ephemeralContainers"] = [{"name": "dbg", "image": "busybox", "resources": {}}]
    sent["spec"]["initContainers"] = [container("setup", limits={"nvidia.com/gpumem-percent": "50"})]
    assert webhook.admit(review(sent))["warnings"] == [
        "unknown resource nvidia.com/gpumem-percent in container setup; did you mean nvidia.com/gpumem-percentage?"
    ]


def test_time_is_not_spent_on_a_clean_pod() -> None:
    started = time.monotonic()
    for _ in range(2000):
        warned({USE_GPUUUID: "GPU-1"}, {GPU: "1", GPU_MEMORY: "1"})
    assert time.monotonic() - started < 1.0
