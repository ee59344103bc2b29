"""The webhook's DRA mode on the real kube-apiserver (docs/dra.md): the apiserver's validation judges the
templates the webhook writes (their CEL, constraints and capacity shapes) and the pod it stores.

The deployed MutatingWebhookConfiguration is registered calling a webhook served with ``dra`` on and the
plane's admin kubeconfig, ``sideEffects: NoneOnDryRun`` as DRA mode needs (it writes templates). No
kube-controller-manager runs here, so no claim is made from the template: that is the resourceclaim
controller's work, not ours.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import pytest

from hami_common.annotations import GPU_SCHEDULER_POLICY, NUMA_BIND, USE_GPUTYPE, USE_GPUUUID
from hami_common.annotations.dra import DRA_LABEL, DRA_LABEL_ON
from hami_common.dra.names import DEVICE_CLASS, REQUEST
from hami_common.resources import GPU, GPU_MEMORY, GPU_MEMORY_PERCENTAGE
from hami_sim.realk8s import ApiError, ControlPlane, K8sBinaries, apply, deployed, webhook_configuration
from hami_sim.waiting import eventually_sync
from tests.webhook.conftest import TlsFiles, offline_settings
from tests.webhook.support import container, pod, served, write_self_signed

Json = dict[str, Any]
TENANT: Final = "dra-tenant"
CONFIG_NAME: Final = "hami-webhook-dra"  # beside any other test's registration on the shared plane
CONFIGS_PATH: Final = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
TEMPLATES_PATH: Final = f"/apis/resource.k8s.io/v1/namespaces/{TENANT}/resourceclaimtemplates"
PODS_PATH: Final = f"/api/v1/namespaces/{TENANT}/pods"
MIB: Final = 1024 * 1024


def _pod(name: str, limits: dict[str, str], annotations: dict[str, str] | None = None) -> Json:
    body = pod(container(limits=limits), name=name, namespace=TENANT, annotations=annotations)
    body.pop("status")
    return body


@pytest.fixture(scope="module")
def dra_plane(
    plane: ControlPlane, k8s: K8sBinaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    folder = tmp_path_factory.mktemp("dra")
    tls = TlsFiles(folder / "tls.crt", folder / "tls.key")
    write_self_signed(tls.cert, tls.key)
    admin = plane.write_kubeconfig(folder / "admin")
    plane.ensure_namespace(TENANT)
    settings = offline_settings(tls, dra=True, kubeconfig=str(admin))
    with served(settings, tls.cert) as webhook:
        config = webhook_configuration(deployed(plane.binaries), webhook.url, tls.cert.read_bytes())
        config["metadata"]["name"] = CONFIG_NAME
        for hook in config["webhooks"]:
            hook["sideEffects"] = "NoneOnDryRun"
        apply(plane.binaries, admin, [config])
        probe = _pod("probe", {GPU: "1"})

        def called() -> bool:
            # kube-apiserver reads webhook configurations from an informer: wait until a create sees it
            try:
                made = plane.request("POST", f"{PODS_PATH}?dryRun=All", probe)
            except ApiError:
                return False
            return "resourceClaims" in made["spec"]

        try:
            eventually_sync(called, what="kube-apiserver calls the DRA-mode webhook")
            yield plane
        finally:
            plane.request("DELETE", f"{CONFIGS_PATH}/{CONFIG_NAME}")


def test_a_hami_pod_is_stored_with_claims_and_its_template_is_a_valid_v1_object(dra_plane: ControlPlane) -> None:
    stored = dra_plane.request("POST", PODS_PATH, _pod("vllm", {GPU: "1", GPU_MEMORY: "3000"}))
    main = stored["spec"]["containers"][0]
    assert not any(name.startswith("nvidia.com/") for name in main["resources"].get("limits", {}))
    assert main["resources"]["claims"] == [{"name": "main-nvidia"}]
    [entry] = stored["spec"]["resourceClaims"]
    assert entry["name"] == "main-nvidia"
    assert stored["metadata"]["labels"][DRA_LABEL] == DRA_LABEL_ON
    assert stored["spec"]["schedulerName"] == "default-scheduler"
    template = dra_plane.request("GET", f"{TEMPLATES_PATH}/{entry['resourceClaimTemplateName']}")
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request["name"] == REQUEST
    exactly = request["exactly"]
    assert (exactly["deviceClassName"], exactly["allocationMode"], exactly["count"]) == (DEVICE_CLASS, "ExactCount", 1)
    # the apiserver stores quantities canonically: 3000 MiB in bytes is 3145728k
    assert exactly["capacity"]["requests"] == {"memory": f"{3000 * MIB // 1000}k", "cores": "0"}


def test_preferences_and_topology_pass_the_apiservers_cel_and_constraint_validation(dra_plane: ControlPlane) -> None:
    annotations = {
        USE_GPUTYPE: "A100,H100",
        USE_GPUUUID: "GPU-0a1b,GPU-2c3d",
        NUMA_BIND: "true",
        GPU_SCHEDULER_POLICY: "topology-aware",
    }
    stored = dra_plane.request("POST", PODS_PATH, _pod("trainer", {GPU: "2", GPU_MEMORY: "20000"}, annotations))
    name = stored["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    spec = dra_plane.request("GET", f"{TEMPLATES_PATH}/{name}")["spec"]["spec"]["devices"]
    assert len(spec["requests"][0]["exactly"]["selectors"]) == 3
    assert len(spec["constraints"]) == 3


def test_pods_asking_the_same_share_one_template(dra_plane: ControlPlane) -> None:
    names = {
        dra_plane.request("POST", PODS_PATH, _pod(f"twin-{i}", {GPU: "1", GPU_MEMORY: "777"}))["spec"][
            "resourceClaims"
        ][0]["resourceClaimTemplateName"]
        for i in range(2)
    }
    assert len(names) == 1


def test_a_dry_run_writes_no_template(dra_plane: ControlPlane) -> None:
    made = dra_plane.request("POST", f"{PODS_PATH}?dryRun=All", _pod("dry", {GPU: "1", GPU_MEMORY: "4321"}))
    name = made["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    with pytest.raises(ApiError) as err:
        dra_plane.request("GET", f"{TEMPLATES_PATH}/{name}")
    assert err.value.status == 404


def test_a_partial_memory_percentage_is_refused_with_why(dra_plane: ControlPlane) -> None:
    with pytest.raises(ApiError) as err:
        dra_plane.request("POST", PODS_PATH, _pod("half", {GPU: "1", GPU_MEMORY_PERCENTAGE: "50"}))
    assert "cannot be asked in DRA mode" in str(err.value)
