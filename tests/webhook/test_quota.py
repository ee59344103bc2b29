"""The namespace quota pre-check (hami-protocol §3 step 7, §4.8; §8 case 23)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from hami_common.annotations import DEVICES_ALLOCATED, NVIDIA_VENDOR, VGPU_NODE
from hami_common.kube import Change, ObjectMeta, Pod, PodSpec, PodStatus, ResourceQuota, ResourceQuotaSpec
from hami_common.kube import Container as KubeContainer
from hami_common.resources import GPU, GPU_CORES, GPU_MEMORY, ResourceConfig
from hami_common.scheduling.quota import NamespaceQuota
from hami_common.vendors.nvidia import NvidiaFamily
from hami_sim.waiting import eventually
from hami_webhook.podview import ContainerSpec, Resources
from hami_webhook.quota import QuotaBook, pod_usage
from hami_webhook.vendors import family_demand
from tests.webhook.conftest import TlsFiles, cluster_settings
from tests.webhook.support import ServedWebhook, container, pod, review, served

NVIDIA_DEVICES = NvidiaFamily().allocated

MEM_LIMIT = "limits." + GPU_MEMORY
CORES_LIMIT = "limits." + GPU_CORES


def placed(name: str, devices: str, *, namespace: str = "team-a", init: int = 0, phase: str = "Running") -> Pod:
    return Pod(
        metadata=ObjectMeta(
            name=name, namespace=namespace, uid=f"uid-{name}", annotations={DEVICES_ALLOCATED: devices}
        ),
        spec=PodSpec(init_containers=tuple(KubeContainer(name=f"i{i}") for i in range(init))),
        status=PodStatus(phase=phase),
    )


def quota(name: str, hard: dict[str, str], namespace: str = "team-a") -> ResourceQuota:
    return ResourceQuota(metadata=ObjectMeta(name=name, namespace=namespace), spec=ResourceQuotaSpec(hard=hard))


@pytest.mark.parametrize(
    ("devices", "init", "expected"),
    [
        ("GPU-a,NVIDIA,1000,30:;", 0, (1000, 30)),
        ("GPU-a,NVIDIA,1000,30:GPU-b,NVIDIA,500,10:;", 0, (1500, 40)),
        ("GPU-a,NVIDIA,1000,80:;GPU-a,NVIDIA,200,20:;", 1, (1000, 80)),
        ("GPU-a,NVIDIA,100,10:;GPU-a,NVIDIA,200,20:;GPU-a,NVIDIA,300,30:;", 1, (500, 50)),
        (";GPU-a,NVIDIA,700,0:;", 0, (700, 0)),
    ],
    ids=[
        "one device",
        "two devices add up",
        "an init container's peak wins over a smaller app",
        "apps on one card add up beyond the init peak",
        "a container without a GPU holds nothing",
    ],
)
def test_pod_usage_is_the_collapsed_device_list(devices: str, init: int, expected: tuple[int, int]) -> None:
    assert pod_usage(placed("p", devices, init=init), NVIDIA_DEVICES) == expected


def test_finished_pods_hold_nothing() -> None:
    assert pod_usage(placed("p", "GPU-a,NVIDIA,1000,30:;", phase="Succeeded"), NVIDIA_DEVICES) == (0, 0)


def test_book_follows_pods_and_quotas_incrementally() -> None:
    book = QuotaBook()
    book.on_quota(Change("ADDED", quota("gpu", {MEM_LIMIT: "2000", CORES_LIMIT: "100", "pods": "10"})))
    book.on_pod(Change("ADDED", placed("a", "GPU-a,NVIDIA,1000,30:;")))
    book.on_pod(Change("ADDED", placed("b", "GPU-b,NVIDIA,300,10:;")))
    assert book.quota("team-a", NVIDIA_VENDOR) == NamespaceQuota(2000, 100, 1300, 40)
    old = placed("b", "GPU-b,NVIDIA,300,10:;")
    book.on_pod(Change("MODIFIED", placed("b", "GPU-b,NVIDIA,300,10:;", phase="Succeeded"), old))
    book.on_pod(Change("DELETED", placed("a", "GPU-a,NVIDIA,1000,30:;")))
    assert (book.quota("team-a", NVIDIA_VENDOR).used_memory, book.quota("team-a", NVIDIA_VENDOR).used_cores) == (0, 0)
    book.on_quota(Change("DELETED", quota("gpu", {})))
    assert book.quota("team-a", NVIDIA_VENDOR).memory_limit is None
    assert book.quota("other", NVIDIA_VENDOR).fits(10**9, 10**9)


def test_the_tightest_of_several_quotas_counts() -> None:
    book = QuotaBook()
    book.on_quota(Change("ADDED", quota("a", {MEM_LIMIT: "4000"})))
    book.on_quota(Change("ADDED", quota("b", {MEM_LIMIT: "2Gi", CORES_LIMIT: "50"})))
    assert (book.quota("team-a", NVIDIA_VENDOR).memory_limit, book.quota("team-a", NVIDIA_VENDOR).cores_limit) == (
        4000,
        50,
    )


def test_a_malformed_device_annotation_is_ignored_for_quota() -> None:
    book = QuotaBook()
    book.on_pod(Change("ADDED", placed("a", "uuid,type,100:;")))
    assert book.quota("team-a", NVIDIA_VENDOR).used_memory == 0


def spec(limits: dict[str, str]) -> Any:
    return ContainerSpec(name="c", resources=Resources(limits=limits)).as_resources()


def test_demand_is_the_larger_of_the_init_peak_and_the_app_sum() -> None:
    config = ResourceConfig()
    init = [spec({GPU: "1", GPU_MEMORY: "800"}), spec({GPU: "1", GPU_MEMORY: "800"})]
    app = [spec({GPU: "1", GPU_MEMORY: "500", GPU_CORES: "10"}), spec({GPU: "2", GPU_MEMORY: "100", GPU_CORES: "5"})]
    assert family_demand(NvidiaFamily(config), init, app) == (800, 20)


def test_a_percentage_only_request_demands_no_memory() -> None:
    assert family_demand(NvidiaFamily(), [], [spec({GPU: "1", "nvidia.com/gpumem-percentage": "50"})]) == (0, 0)


# --- end to end: ResourceQuota and a placed pod in the emulator, admission over HTTPS -----------------------


def gpu(memory: str, count: str = "1") -> dict[str, str]:
    return {GPU: count, GPU_MEMORY: memory}


def exceeding(requested: int, used: int = 1000, limit: int = 2000) -> str:
    """The denial of team-a's quota: the resource, the request, the namespace's use and the limit (issue 31.4)."""
    return (
        f"exceeding resource quota: limits.{GPU_MEMORY}: the pod requests {requested} MiB, "
        f"the namespace uses {used} MiB, the limit is {limit} MiB"
    )


CASE_23: list[Any] = [
    pytest.param(pod(container(limits=gpu("100")), namespace="team-a"), None, id="100 MiB more fits"),
    pytest.param(pod(container(limits=gpu("1024")), namespace="team-a"), exceeding(1024), id="1024 MiB more exceeds"),
    pytest.param(
        pod(container(limits=gpu("1024", "2")), namespace="team-a"), exceeding(2048), id="two GPUs of 1024 exceed"
    ),
    pytest.param(pod(container(limits=gpu("400", "2")), namespace="team-a"), None, id="two GPUs of 400 fit"),
    pytest.param(
        pod(
            container(limits=gpu("500")),
            init=(container("i1", limits=gpu("800")), container("i2", limits=gpu("800"))),
            namespace="team-a",
        ),
        None,
        id="init containers count their peak, not their sum",
    ),
    pytest.param(pod(container(limits=gpu("5000")), namespace="elsewhere"), None, id="a namespace without quota"),
]


@pytest.fixture
def quota_webhook(core: Any, kubeconfig: Path, tls_files: TlsFiles) -> Any:
    for ns in ("team-a", "elsewhere"):
        core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_resource_quota(
        "team-a", {"metadata": {"name": "gpu"}, "spec": {"hard": {MEM_LIMIT: "2000", "pods": "20"}}}
    )
    used = pod(container(limits=gpu("1000")), name="running", namespace="team-a", scheduler="hami-scheduler")
    used["metadata"]["labels"][VGPU_NODE] = "node-1"
    used["metadata"]["annotations"] = {DEVICES_ALLOCATED: "GPU-a,NVIDIA,1000,0:;", VGPU_NODE: "node-1"}
    core.create_namespaced_pod("team-a", used)
    with served(cluster_settings(tls_files, kubeconfig), tls_files.cert) as running:
        yield running


async def ready(webhook: ServedWebhook) -> None:
    async def probe() -> bool:
        async with httpx.AsyncClient(verify=False) as http:
            return (await http.get(webhook.url + "/readyz")).status_code == 200

    await eventually(probe, what="webhook caches synced")


@pytest.mark.parametrize(("original", "denial"), CASE_23)
async def test_quota_against_a_resourcequota_and_placed_pods(
    quota_webhook: ServedWebhook, original: Any, denial: str | None
) -> None:
    await ready(quota_webhook)
    response = quota_webhook.admit(review(original))
    assert response["allowed"] is (denial is None)
    if denial is not None:
        assert response["status"] == {"code": 403, "reason": "Forbidden", "message": denial}


async def test_a_placed_pod_without_the_node_label_still_counts_against_the_quota(
    core: Any, kubeconfig: Path, tls_files: TlsFiles
) -> None:
    """The hami.io/vgpu-node label is the tenant's to remove; the device annotation is not (issue 16 item 10)."""
    core.create_namespace({"metadata": {"name": "team-a"}})
    core.create_namespaced_resource_quota(
        "team-a", {"metadata": {"name": "gpu"}, "spec": {"hard": {MEM_LIMIT: "2000"}}}
    )
    unlabelled = pod(container(limits=gpu("1000")), name="running", namespace="team-a", scheduler="hami-scheduler")
    unlabelled["metadata"]["labels"].pop(VGPU_NODE, None)
    unlabelled["metadata"]["annotations"] = {DEVICES_ALLOCATED: "GPU-a,NVIDIA,1000,0:;", VGPU_NODE: "node-1"}
    core.create_namespaced_pod("team-a", unlabelled)
    with served(cluster_settings(tls_files, kubeconfig), tls_files.cert) as webhook:
        await ready(webhook)
        response = webhook.admit(review(pod(container(limits=gpu("1500")), namespace="team-a")))
        assert response["allowed"] is False
        assert response["status"]["message"] == exceeding(1500)
        assert webhook.admit(review(pod(container(limits=gpu("1000")), namespace="team-a")))["allowed"] is True
