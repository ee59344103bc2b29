"""The configured device families at admission (hami-vendors §0.2 "Webhook", §1.3, §2.3, §3.3), each case a real
AdmissionReview over HTTPS to a webhook whose device config enables Ascend (the chart's seven chips),
Cambricon and Hygon. Allowed cases apply the returned JSON Patch to the original pod and compare the result
with the pod HAMi would store.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_common.events import QuotaResource
from hami_common.kube import Change, ObjectMeta, Pod, ResourceQuota, ResourceQuotaSpec
from hami_common.resources import GPU, GPU_CORES, GPU_MEMORY
from hami_common.vendors.ascend.config import CHART_CHIPS, ChipConfig
from hami_common.vendors.ascend.keys import ASCEND_VISIBLE_DEVICES, MODE_HAMI_CORE, VNPU_MODE
from hami_common.vendors.cambricon.keys import DEVICES_ALLOCATED as MLU_ALLOCATED
from hami_common.vendors.cambricon.keys import DSMLU_ASSIGHED as MLU_ASSIGHED
from hami_common.vendors.cambricon.keys import DSMLU_PROFILE as MLU_PROFILE
from hami_common.vendors.cambricon.keys import MLU_CORES, MLU_COUNT, MLU_MEMORY
from hami_common.vendors.hygon.keys import DCU_CORES, DCU_COUNT, DCU_MEMORY
from hami_common.vendors.hygon.keys import DEVICES_ALLOCATED as DCU_ALLOCATED
from hami_common.vendors.hygon.keys import DEVICES_TO_ALLOCATE as DCU_TO_ALLOCATE
from hami_webhook.quota import QuotaBook
from hami_webhook.settings import WebhookSettings
from tests.webhook.conftest import TlsFiles, cluster_settings, offline_settings
from tests.webhook.support import Json, ServedWebhook, container, patch_ops, patched, pod, review, served
from tests.webhook.test_quota import ready

HAMI = "hami-scheduler"
ALL_FAMILIES = "vnpus:\n  enabled: true\ncambricon: {}\nhygon: {}\n"


def chip(word: str) -> ChipConfig:
    return next(c for c in CHART_CHIPS if c.common_word == word)


B3 = chip("Ascend910B3")
C910 = chip("Ascend910C")
P310 = chip("Ascend310P")


def config_file(folder: Path, text: str) -> str:
    path = folder / "device-config.yaml"
    path.write_text(text)
    return str(path)


def vendor_settings(tls: TlsFiles, folder: Path, text: str = ALL_FAMILIES, **overrides: object) -> WebhookSettings:
    return offline_settings(tls, device_config_file=config_file(folder, text), **overrides)


@pytest.fixture(scope="module")
def vendors(tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedWebhook]:
    """A webhook with Ascend (chart chips), Cambricon and Hygon enabled."""
    with served(vendor_settings(tls_files, tmp_path_factory.mktemp("vendors")), tls_files.cert) as running:
        yield running


def changed(original: Json, edit: Callable[[Json], None]) -> Json:
    result = copy.deepcopy(original)
    edit(result)
    return result


def resources(p: Json, kind: str, index: int = 0) -> dict[str, str]:
    found: dict[str, str] = p["spec"]["containers"][index]["resources"].setdefault(kind, {})
    return found


def scheduled_with(
    limits: dict[str, str] | None = None, requests: dict[str, str] | None = None
) -> Callable[[Json], None]:
    """The HAMi scheduler set, and the given limits and requests written into the first container."""

    def edit(p: Json) -> None:
        p["spec"]["schedulerName"] = HAMI
        resources(p, "limits").update(limits or {})
        if requests:
            resources(p, "requests").update(requests)

    return edit


def ascend(c: ChipConfig, count: str = "1", memory: str | None = None, core: str | None = None) -> dict[str, str]:
    limits = {c.resource_name: count}
    if memory is not None:
        limits[c.resource_memory_name] = memory
    if core is not None:
        limits[c.resource_core_name] = core
    return limits


# --- Ascend: template rounding, 910C modules, hard-split cores (hami-vendors §1.3) --------------------------

ROUNDED: list[Any] = [
    pytest.param(B3, "2000", "16384", id="910B3 2000 MiB rounds up to template vir05_1c_16g"),
    pytest.param(B3, "20000", "32768", id="910B3 20000 MiB rounds up to template vir10_3c_32g"),
    pytest.param(B3, "40000", "65536", id="910B3 40000 MiB is above every template: the whole card"),
    pytest.param(B3, None, "65536", id="910B3 without memory gets the whole card written in"),
    pytest.param(P310, "13000", "21527", id="310P 13000 MiB is the whole card, its allocatable memory"),
]


@pytest.mark.parametrize(("c", "asked", "rounded"), ROUNDED)
def test_an_ascend_pod_in_hard_split_mode_gets_its_memory_rounded_in_limits_and_requests(
    vendors: ServedWebhook, c: ChipConfig, asked: str | None, rounded: str
) -> None:
    original = pod(container(limits=ascend(c, memory=asked)))
    response = vendors.admit(review(original))
    assert response["allowed"] is True
    expected = scheduled_with({c.resource_memory_name: rounded}, {c.resource_memory_name: rounded})
    assert patched(original, response) == changed(original, expected)


def test_requests_the_pod_already_has_are_rewritten_too(vendors: ServedWebhook) -> None:
    asked = ascend(B3, memory="3000")
    original = pod(container(limits=asked, requests=dict(asked)))
    response = vendors.admit(review(original))
    expected = scheduled_with({B3.resource_memory_name: "16384"}, {B3.resource_memory_name: "16384"})
    assert patched(original, response) == changed(original, expected)


def test_soft_split_keeps_the_raw_memory_and_its_core_share(vendors: ServedWebhook) -> None:
    original = pod(container(limits=ascend(B3, memory="15360", core="20")), annotations={VNPU_MODE: MODE_HAMI_CORE})
    response = vendors.admit(review(original))
    expected = scheduled_with(requests={B3.resource_memory_name: "15360"})
    assert patched(original, response) == changed(original, expected)


@pytest.mark.parametrize(
    ("limits", "requests"),
    [
        pytest.param(ascend(B3, memory="2000", core="10"), None, id="core share in limits"),
        pytest.param(ascend(B3, memory="2000"), {B3.resource_core_name: "25"}, id="core share in requests"),
    ],
)
def test_a_core_request_in_hard_split_mode_is_errored_with_hamis_message(
    vendors: ServedWebhook, limits: dict[str, str], requests: dict[str, str] | None
) -> None:
    response = vendors.admit(review(pod(container(limits=limits, requests=requests))))
    assert response["allowed"] is False
    assert response["status"] == {
        "code": 500,
        "message": f"{B3.resource_core_name} is only supported in hami-core (soft split) mode",
    }
    assert patch_ops(response) == []


def test_a_core_share_of_zero_is_allowed_in_hard_split_mode(vendors: ServedWebhook) -> None:
    response = vendors.admit(review(pod(container(limits=ascend(B3, memory="2000", core="0")))))
    assert response["allowed"] is True


def test_910c_count_one_becomes_one_module_of_two_npus(vendors: ServedWebhook) -> None:
    original = pod(container(limits=ascend(C910), requests={C910.resource_name: "1"}))
    response = vendors.admit(review(original))
    whole = str(C910.memory_allocatable)
    expected = scheduled_with(
        {C910.resource_name: "2", C910.resource_memory_name: whole},
        {C910.resource_name: "2", C910.resource_memory_name: whole},
    )
    assert patched(original, response) == changed(original, expected)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        pytest.param(ascend(C910, count="3"), "Ascend910C device request must be 1 or 2*n, got 3", id="910C count 3"),
        pytest.param(ascend(B3, memory="70000"), f"{B3.resource_memory_name} 70000 is invalid", id="over capacity"),
        pytest.param(ascend(P310, memory="25000"), f"{P310.resource_memory_name} 25000 is invalid", id="310P 25000"),
        pytest.param(
            ascend(B3, count="2", memory="8192"),
            "vNPU not supported for multiple devices",
            id="two vNPUs of a template",
        ),
    ],
)
def test_ascend_refusals_are_errored_500_with_hamis_message(
    vendors: ServedWebhook, limits: dict[str, str], message: str
) -> None:
    response = vendors.admit(review(pod(container(limits=limits))))
    assert response["allowed"] is False
    assert response["status"] == {"code": 500, "message": message}


def test_every_container_is_admitted_init_containers_first(vendors: ServedWebhook) -> None:
    original = pod(
        container(limits=ascend(B3, memory="20000")), init=(container("setup", limits=ascend(B3, memory="1")),)
    )
    response = vendors.admit(review(original))
    paths = [op["path"] for op in patch_ops(response) if "resources" in op["path"]]
    assert [p.split("/")[2] for p in paths] == ["initContainers", "initContainers", "containers", "containers"]
    stored = patched(original, response)
    assert stored["spec"]["initContainers"][0]["resources"]["limits"][B3.resource_memory_name] == "16384"
    assert stored["spec"]["containers"][0]["resources"]["limits"][B3.resource_memory_name] == "32768"


# --- Cambricon and Hygon: routed, not mutated (hami-vendors §2.3, §3.3) -------------------------------------


@pytest.mark.parametrize(
    "limits",
    [
        pytest.param({MLU_COUNT: "1", MLU_MEMORY: "20", MLU_CORES: "10"}, id="a Cambricon sMLU"),
        pytest.param({MLU_COUNT: "1"}, id="a whole Cambricon MLU"),
        pytest.param({DCU_COUNT: "1", DCU_MEMORY: "2000", DCU_CORES: "60"}, id="a Hygon vDCU"),
        pytest.param({DCU_COUNT: "2"}, id="two whole Hygon DCUs"),
    ],
)
def test_a_cambricon_or_hygon_pod_is_routed_to_the_hami_scheduler_and_nothing_else(
    vendors: ServedWebhook, limits: dict[str, str]
) -> None:
    original = pod(container(limits=limits))
    response = vendors.admit(review(original))
    assert response["allowed"] is True
    assert patch_ops(response) == [{"op": "replace", "path": "/spec/schedulerName", "value": HAMI}]


def test_a_family_count_only_in_requests_does_not_make_a_device_pod(vendors: ServedWebhook) -> None:
    """HAMi's MutateAdmission looks at limits only (hami-vendors §2.3, §3.3)."""
    response = vendors.admit(review(pod(container(requests={DCU_COUNT: "1"}))))
    assert response["allowed"] is True
    assert patch_ops(response) == []


# --- several vendors in one container -----------------------------------------------------------------------


def test_nvidia_and_hygon_in_one_container_are_both_handled(vendors: ServedWebhook) -> None:
    original = pod(container(limits={GPU: "1", DCU_COUNT: "1", DCU_MEMORY: "2000"}))
    response = vendors.admit(review(original))
    assert patched(original, response) == changed(original, scheduled_with({GPU_CORES: "100"}))


def test_nvidia_and_ascend_in_one_container_get_both_rewrites(vendors: ServedWebhook) -> None:
    original = pod(container(limits={GPU: "1", **ascend(B3, memory="2000")}))
    response = vendors.admit(review(original))
    expected = scheduled_with({GPU_CORES: "100", B3.resource_memory_name: "16384"}, {B3.resource_memory_name: "16384"})
    assert patched(original, response) == changed(original, expected)


# --- device-pod rules cover every family ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "limits",
    [pytest.param(ascend(B3, memory="2000"), id="Ascend"), pytest.param({MLU_COUNT: "1"}, id="Cambricon")],
)
def test_a_privileged_container_in_a_family_pod_is_denied(vendors: ServedWebhook, limits: dict[str, str]) -> None:
    original = pod(container(limits=limits), container("sidecar", privileged=True))
    response = vendors.admit(review(original))
    assert response["allowed"] is False
    assert response["status"] == {"code": 403, "reason": "Forbidden", "message": "container sidecar is privileged"}


def test_an_ephemeral_container_asking_for_a_family_resource_is_denied(vendors: ServedWebhook) -> None:
    old = pod(container(limits={DCU_COUNT: "1"}), scheduler=HAMI)
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [container("debugger", limits={DCU_MEMORY: "100"})]
    response = vendors.admit(review(new, operation="UPDATE", old=old))
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        f"ephemeral container debugger requests {DCU_MEMORY}: ephemeral containers cannot have GPUs"
    )


def test_a_family_pod_with_a_node_name_is_denied(vendors: ServedWebhook) -> None:
    response = vendors.admit(review(pod(container(limits={MLU_COUNT: "1"}), node_name="node-1")))
    assert response["status"]["message"] == "pod has node assigned"


# --- families disabled: their resources are nobody's ----------------------------------------------------------


@pytest.mark.parametrize(
    "limits",
    [
        pytest.param(ascend(B3, memory="2000", core="10"), id="Ascend memory and core"),
        pytest.param(ascend(C910), id="910C count 1"),
        pytest.param({MLU_COUNT: "1"}, id="Cambricon"),
        pytest.param({DCU_COUNT: "1"}, id="Hygon"),
    ],
)
def test_with_the_families_disabled_their_resources_change_nothing(
    webhook: ServedWebhook, limits: dict[str, str]
) -> None:
    response = webhook.admit(review(pod(container(limits=limits))))
    assert response["allowed"] is True
    assert patch_ops(response) == []


def test_an_ascend_section_without_enabled_true_changes_nothing(tls_files: TlsFiles, tmp_path: Path) -> None:
    settings_ = vendor_settings(tls_files, tmp_path, "vnpus: {hamiVnpuCore: true}\n")
    with served(settings_, tls_files.cert) as running:
        response = running.admit(review(pod(container(limits=ascend(B3, memory="2000")))))
    assert patch_ops(response) == []


# --- runtimeClassName and overwriteEnv from a chip's config ----------------------------------------------------

CUSTOM_CHIP = """\
vnpus:
  enabled: true
  configs:
  - commonWord: Ascend910B3
    chipName: 910B3
    resourceName: huawei.com/Ascend910B3
    resourceMemoryName: huawei.com/Ascend910B3-memory
    resourceCoreName: huawei.com/Ascend910B3-core
    memoryAllocatable: 65536
    memoryCapacity: 65536
    aiCore: 20
    runtimeClassName: ascend
    overwriteEnv: true
    templates:
    - {name: vir05_1c_16g, memory: 16384, aiCore: 5, aiCPU: 1}
"""


@pytest.fixture(scope="module")
def custom(tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedWebhook]:
    settings_ = vendor_settings(tls_files, tmp_path_factory.mktemp("custom"), CUSTOM_CHIP)
    with served(settings_, tls_files.cert) as running:
        yield running


def test_a_configured_runtime_class_is_set_on_an_ascend_pod_without_one(custom: ServedWebhook) -> None:
    original = pod(container(limits=ascend(B3, memory="2000")))
    stored = patched(original, custom.admit(review(original)))
    assert stored["spec"]["runtimeClassName"] == "ascend"
    kept = pod(container(limits=ascend(B3, memory="2000")), runtime_class="mine")
    assert patched(kept, custom.admit(review(kept)))["spec"]["runtimeClassName"] == "mine"


def test_overwrite_env_hides_npus_from_containers_without_them(custom: ServedWebhook) -> None:
    original = pod(container(limits=ascend(B3, memory="2000")), container("cpu", limits={"cpu": "1"}))
    stored = patched(original, custom.admit(review(original)))
    assert "env" not in stored["spec"]["containers"][0]
    assert stored["spec"]["containers"][1]["env"] == [{"name": ASCEND_VISIBLE_DEVICES, "value": ""}]


# --- malformed family quantities ------------------------------------------------------------------------------

FAMILY_RESOURCES = (B3.resource_name, B3.resource_memory_name, MLU_COUNT, MLU_MEMORY, DCU_COUNT, DCU_MEMORY, DCU_CORES)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        pytest.param("12abc", "it is not a quantity", id="not a quantity"),
        pytest.param("-1", "it is negative", id="negative"),
        pytest.param("1500m", "it is not a whole number", id="a fraction"),
        pytest.param("2147483648", "it is too large", id="past int32"),
        pytest.param("3Gi", "it is too large", id="a unit on a count, past int32"),
    ],
)
@pytest.mark.parametrize("resource", [B3.resource_memory_name, MLU_MEMORY, DCU_COUNT])
def test_a_malformed_family_quantity_is_a_clear_400(
    vendors: ServedWebhook, resource: str, value: str, why: str
) -> None:
    limits = {resource: value}
    response = vendors.admit(review(pod(container(limits=limits))))
    assert response["allowed"] is False
    assert response["status"] == {
        "code": 400,
        "message": f"invalid {resource} value {value!r} in container main: {why}; "
        "it must be a whole number from 0 to 2147483647",
    }


def test_a_family_memory_past_int32_once_in_mib_is_refused_with_the_range_in_its_own_unit(
    vendors: ServedWebhook,
) -> None:
    """Cambricon's memory is in 256 MiB units: 8388608 of them is 2³¹ MiB, which HAMi's int32 cannot hold."""
    response = vendors.admit(review(pod(container(limits={MLU_COUNT: "1", MLU_MEMORY: "8388608"}))))
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        f"invalid {MLU_MEMORY} value '8388608' in container main: it is too large; "
        "it must be a whole number from 0 to 8388607"
    )
    assert vendors.admit(review(pod(container(limits={MLU_COUNT: "1", MLU_MEMORY: "8388607"}))))["allowed"] is True


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    resource=st.sampled_from(FAMILY_RESOURCES),
    value=st.one_of(
        st.text(max_size=20),
        st.integers(-(2**40), 2**40).map(str),
        st.from_regex(r"[0-9.]{1,6}[a-zA-Z]{0,2}", fullmatch=True),
    ),
)
def test_any_family_quantity_gets_an_answer_and_the_webhook_keeps_serving(
    vendors: ServedWebhook, resource: str, value: str
) -> None:
    answer = vendors.post(review(pod(container(limits={resource: value}))))
    assert answer.status_code == 200
    body = answer.json()["response"]
    assert body["allowed"] or body["status"]["code"] in (400, 500)
    if not body["allowed"]:
        assert body["status"]["message"]
    assert vendors.admit(review(pod(container(limits={DCU_COUNT: "1"}))))["allowed"] is True


# --- quota per vendor resource (hami-vendors §0.2, §2.3) --------------------------------------------------------


@pytest.fixture
def vendor_quota(core: Any, kubeconfig: Path, tls_files: TlsFiles, tmp_path: Path) -> Iterator[ServedWebhook]:
    """team-a: 50 vmemory units of Cambricon (12800 MiB) with 10240 MiB held, 4000 MiB of Hygon with 3000 held."""
    core.create_namespace({"metadata": {"name": "team-a"}})
    hard = {f"limits.{MLU_MEMORY}": "50", f"limits.{DCU_MEMORY}": "4000"}
    core.create_namespaced_resource_quota("team-a", {"metadata": {"name": "devices"}, "spec": {"hard": hard}})
    held = pod(container(limits={MLU_COUNT: "1", DCU_COUNT: "1"}), name="running", namespace="team-a", scheduler=HAMI)
    held["metadata"]["annotations"] = {
        MLU_ALLOCATED: "node-1-cambricon-mlu-0,MLU,10240,10:;",
        DCU_ALLOCATED: "DCU-1,DCU,3000,50:;",
    }
    core.create_namespaced_pod("team-a", held)
    text = config_file(tmp_path, ALL_FAMILIES)
    with served(cluster_settings(tls_files, kubeconfig, device_config_file=text), tls_files.cert) as running:
        yield running


def exceeding(resource: str, requested: int, used: int, limit: int) -> str:
    return (
        f"exceeding resource quota: limits.{resource}: the pod requests {requested} MiB, "
        f"the namespace uses {used} MiB, the limit is {limit} MiB"
    )


QUOTA_CASES: list[Any] = [
    pytest.param({MLU_COUNT: "1", MLU_MEMORY: "10"}, None, id="10 MLU units (2560 MiB) more reach the limit exactly"),
    pytest.param(
        {MLU_COUNT: "1", MLU_MEMORY: "11"},
        exceeding(MLU_MEMORY, 11 * 256, 10240, 50 * 256),
        id="11 MLU units exceed 50 units of 256 MiB, named in MiB",
    ),
    pytest.param({DCU_COUNT: "1", DCU_MEMORY: "1000"}, None, id="1000 DCU MiB more fit"),
    pytest.param(
        {DCU_COUNT: "2", DCU_MEMORY: "600"}, exceeding(DCU_MEMORY, 1200, 3000, 4000), id="two DCUs of 600 MiB exceed"
    ),
    pytest.param({GPU: "1", GPU_MEMORY: "100000"}, None, id="NVIDIA is not limited by the vendors' quota"),
]


@pytest.mark.parametrize(("limits", "denial"), QUOTA_CASES)
async def test_quota_is_enforced_per_vendor_resource(
    vendor_quota: ServedWebhook, limits: dict[str, str], denial: str | None
) -> None:
    await ready(vendor_quota)
    response = vendor_quota.admit(review(pod(container(limits=limits), namespace="team-a")))
    assert response["allowed"] is (denial is None)
    if denial is not None:
        assert response["status"] == {"code": 403, "reason": "Forbidden", "message": denial}


def test_the_quota_book_announces_each_vendors_resources(tls_files: TlsFiles, tmp_path: Path) -> None:
    """The metrics service's hami_resource_quota_* series get the families' quota too (issue 20 item 6)."""
    policy = vendor_settings(tls_files, tmp_path).policy()
    book = QuotaBook(policy.devices)
    hard = {f"limits.{MLU_MEMORY}": "50", f"limits.{DCU_CORES}": "200", f"limits.{GPU_MEMORY}": "1000"}
    book.on_quota(Change("ADDED", ResourceQuota(metadata=ObjectMeta(name="q", namespace="team-a"),
                                                spec=ResourceQuotaSpec(hard=hard))))  # fmt: skip
    annotations = {MLU_ALLOCATED: "m-0,MLU,5120,10:;", DCU_ALLOCATED: "DCU-1,DCU,2000,60:DCU-2,DCU,2000,60:;"}
    held = Pod(metadata=ObjectMeta(name="p", namespace="team-a", uid="u", annotations=annotations))
    book.on_pod(Change("ADDED", held))
    assert book.limited() == ["team-a"]
    assert set(book.usage("team-a", 0).resources) == {
        QuotaResource(name=GPU_MEMORY, used=0, limit=1000),
        QuotaResource(name=MLU_MEMORY, used=5120, limit=50),
        QuotaResource(name=DCU_CORES, used=120, limit=200),
    }
    assert set(book.quotas("team-a")) == {"NVIDIA", "MLU", "DCU"}
    book.on_pod(Change("DELETED", held))
    assert book.quotas("team-a")["DCU"].used_cores == 0


# --- the families' own annotations are the system's (ARCHITECTURE §3) ----------------------------------------

TENANT = "system:serviceaccount:team-a:default"


@pytest.mark.parametrize(
    ("limits", "key", "value"),
    [
        pytest.param({DCU_COUNT: "1"}, DCU_TO_ALLOCATE, "DCU-1,DCU,65520,100:;", id="Hygon's device list"),
        pytest.param({MLU_COUNT: "1"}, MLU_PROFILE, "0_100_256", id="Cambricon's sMLU profile"),
        pytest.param({MLU_COUNT: "1"}, MLU_ASSIGHED, "false", id="Cambricon's plugin's spelling"),
        pytest.param(
            {f"huawei.com/{B3.common_word}": "1"},
            f"huawei.com/{B3.common_word}",
            '[{"UUID":"die-0"}]',
            id="Ascend's runtime JSON",
        ),
    ],
)
def test_a_tenant_may_not_set_a_familys_scheduler_owned_annotation(
    vendors: ServedWebhook, limits: dict[str, str], key: str, value: str
) -> None:
    """The vendor's device plugin trusts these as HAMi's trusts hami.io/vgpu-devices-to-allocate: a tenant
    writing one could be handed devices the scheduler never granted."""
    response = vendors.admit(review(pod(container(limits=limits), annotations={key: value}), user=TENANT))
    assert response["allowed"] is False
    assert key in response["status"]["message"]
    old = pod(container(limits=limits), scheduler=HAMI, annotations={})
    updated = vendors.admit(review(pod(container(limits=limits), scheduler=HAMI, annotations={key: value}),
                                   operation="UPDATE", old=old, user=TENANT))  # fmt: skip
    assert updated["allowed"] is False
