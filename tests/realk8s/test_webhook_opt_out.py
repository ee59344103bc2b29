"""No tenant-settable opt-out from the webhook (issue 16 item 1, HAMi#3041), on the real kube-apiserver.

The deployed MutatingWebhookConfiguration is registered, pointed at a served webhook; a tenant then creates
pods labelled ``hami.io/webhook=ignore``. The apiserver must still call the webhook for them: a pod with a
forged scheduler-owned annotation is refused, and a GPU pod is routed to our scheduler. Only a namespace
label (which the tenant cannot set) still excludes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import pytest

from hami_common.annotations import DEVICES_TO_ALLOCATE, WEBHOOK_IGNORE, WEBHOOK_LABEL
from hami_common.resources import GPU, GPU_MEMORY
from hami_sim.realk8s import ApiError, ControlPlane, apply, deployed, webhook_configuration
from hami_sim.waiting import eventually_sync
from tests.webhook.conftest import TlsFiles, offline_settings
from tests.webhook.support import container, pod, served, write_self_signed

Json = dict[str, Any]
TENANT: Final = "opt-out-tenant"
OPTED_OUT_NAMESPACE: Final = "opt-out-admin"
SCHEDULER: Final = "hami-scheduler"
FORGED: Final = "GPU-forged,NVIDIA,80000,100:;"


def _labelled(obj: Json, labels: dict[str, str]) -> Json:
    obj["metadata"]["labels"] = {**obj["metadata"].get("labels", {}), **labels}
    obj.pop("status", None)
    return obj


def _create(plane: ControlPlane, namespace: str, obj: Json, dry_run: bool = False) -> Json:
    query = "?dryRun=All" if dry_run else ""
    return plane.request("POST", f"/api/v1/namespaces/{namespace}/pods{query}", obj)


@pytest.fixture(scope="module")
def registered(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The deployed webhook configuration, calling a served webhook; removed again afterwards, so the shared
    control plane's other tests never meet a fail-closed webhook that has stopped."""
    folder = tmp_path_factory.mktemp("opt-out")
    tls = TlsFiles(folder / "tls.crt", folder / "tls.key")
    write_self_signed(tls.cert, tls.key)
    admin = plane.write_kubeconfig(folder / "admin")
    plane.ensure_namespace(TENANT)
    opted_out = {"name": OPTED_OUT_NAMESPACE, "labels": {WEBHOOK_LABEL: WEBHOOK_IGNORE}}
    plane.create("", "v1", "namespaces", None, {"apiVersion": "v1", "kind": "Namespace", "metadata": opted_out})
    with served(offline_settings(tls), tls.cert) as webhook:
        config = webhook_configuration(deployed(plane.binaries), webhook.url, tls.cert.read_bytes())
        apply(plane.binaries, admin, [config])
        name = config["metadata"]["name"]
        try:
            probe = pod(container(limits={GPU: "1"}), name="probe", namespace=TENANT)

            def called() -> bool:
                try:
                    made = _create(plane, TENANT, _labelled(probe, {}), dry_run=True)
                except ApiError:
                    return False
                return bool(made["spec"]["schedulerName"] == SCHEDULER)

            eventually_sync(called, what="kube-apiserver calls the registered webhook")
            yield plane
        finally:
            plane.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}")


def test_a_pod_labelled_to_opt_out_still_cannot_forge_a_gpu_grant(registered: ControlPlane) -> None:
    forged = pod(
        container(), name="forger", namespace=TENANT, scheduler=None, annotations={DEVICES_TO_ALLOCATE: FORGED}
    )
    with pytest.raises(ApiError) as refused:
        _create(registered, TENANT, _labelled(forged, {WEBHOOK_LABEL: WEBHOOK_IGNORE}))
    assert refused.value.status == 403
    assert "denied the request" in str(refused.value)
    assert DEVICES_TO_ALLOCATE in str(refused.value)


def test_a_gpu_pod_labelled_to_opt_out_is_still_routed_to_our_scheduler(registered: ControlPlane) -> None:
    gpu = pod(container(limits={GPU: "1"}), name="labelled-gpu", namespace=TENANT)
    made = _create(registered, TENANT, _labelled(gpu, {WEBHOOK_LABEL: WEBHOOK_IGNORE}), dry_run=True)
    assert made["spec"]["schedulerName"] == SCHEDULER


def test_a_namespace_the_administrator_opted_out_is_not_sent_to_the_webhook(registered: ControlPlane) -> None:
    gpu = pod(container(limits={GPU: "1"}), name="admin-gpu", namespace=OPTED_OUT_NAMESPACE)
    made = _create(registered, OPTED_OUT_NAMESPACE, _labelled(gpu, {}), dry_run=True)
    assert made["spec"]["schedulerName"] == "default-scheduler"


def test_a_privileged_debugger_cannot_be_attached_to_a_gpu_pod(registered: ControlPlane) -> None:
    """``kubectl debug`` adds an ephemeral container through pods/ephemeralcontainers: the apiserver sends
    that UPDATE to the webhook, which denies a privileged one on a GPU pod (issue 16 item 10)."""
    gpu = pod(container(limits={GPU: "1"}), name="debugged-gpu", namespace=TENANT)
    _create(registered, TENANT, _labelled(gpu, {}))
    debugger = {"name": "debugger", "image": "busybox", "securityContext": {"privileged": True}}
    path = f"/api/v1/namespaces/{TENANT}/pods/debugged-gpu/ephemeralcontainers"
    patch = {"spec": {"ephemeralContainers": [debugger]}}
    with pytest.raises(ApiError) as refused:
        registered.request("PATCH", path, patch, "application/strategic-merge-patch+json")
    assert refused.value.status == 403
    assert "ephemeral container debugger is privileged" in str(refused.value)
    unprivileged = {"spec": {"ephemeralContainers": [{"name": "plain", "image": "busybox"}]}}
    registered.request("PATCH", path, unprivileged, "application/strategic-merge-patch+json")


@pytest.mark.parametrize("memory", ["3Gi", "3221225472"])
def test_gpu_memory_past_int32_is_refused_at_admission_naming_the_resource_and_range(
    registered: ControlPlane, memory: str
) -> None:
    """kube-apiserver lets a whole, non-negative extended resource through, however large; HAMi then reads
    ``gpumem: 3Gi`` (3221225472 MiB, past its int32) as asking for no GPU, and the pod was bound with no
    placement and served another pod's grant (issue 28 item 1a). The webhook refuses it with the range."""
    greedy = pod(container(limits={GPU: "1", GPU_MEMORY: memory}), name="greedy", namespace=TENANT)
    with pytest.raises(ApiError) as refused:
        _create(registered, TENANT, _labelled(greedy, {}), dry_run=True)
    assert refused.value.status == 400
    assert f"invalid {GPU_MEMORY} value {memory!r} in container main: it is too large" in str(refused.value)
    assert "it must be a whole number from 0 to 2147483647" in str(refused.value)


def test_gpu_memory_the_apiserver_writes_with_a_suffix_is_admitted(registered: ControlPlane) -> None:
    """kube-apiserver canonicalises ``3000`` to ``3k`` before the webhook sees it: a suffix is no refusal."""
    fine = pod(container(limits={GPU: "1", GPU_MEMORY: "3000"}), name="fine", namespace=TENANT)
    made = _create(registered, TENANT, _labelled(fine, {}), dry_run=True)
    assert made["spec"]["containers"][0]["resources"]["limits"][GPU_MEMORY] == "3k"
    assert made["spec"]["schedulerName"] == SCHEDULER


def test_a_gpu_pod_or_debugger_adding_all_capabilities_is_refused(registered: ControlPlane) -> None:
    """``capabilities.add: [all]`` includes CAP_SYS_ADMIN (issue 28 item 3): refused on a GPU pod, and on a
    debugger attached to one through pods/ephemeralcontainers, as kube-apiserver sends them to the webhook."""
    ctr = container(limits={GPU: "1"})
    ctr["securityContext"] = {"capabilities": {"add": ["all"]}}
    with pytest.raises(ApiError) as refused:
        _create(registered, TENANT, _labelled(pod(ctr, name="all-caps", namespace=TENANT), {}), dry_run=True)
    assert refused.value.status == 403
    assert "container main adds CAP_SYS_ADMIN (capabilities.add 'all' is every capability)" in str(refused.value)
    _create(registered, TENANT, _labelled(pod(container(limits={GPU: "1"}), name="all-debugged", namespace=TENANT), {}))
    debugger = {"name": "debugger", "image": "busybox", "securityContext": {"capabilities": {"add": ["ALL"]}}}
    path = f"/api/v1/namespaces/{TENANT}/pods/all-debugged/ephemeralcontainers"
    with pytest.raises(ApiError) as refused:
        registered.request(
            "PATCH", path, {"spec": {"ephemeralContainers": [debugger]}}, "application/strategic-merge-patch+json"
        )
    assert refused.value.status == 403
    assert "ephemeral container debugger adds CAP_SYS_ADMIN" in str(refused.value)
