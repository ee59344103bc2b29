"""The deployed ValidatingAdmissionPolicies, enforced by the real kube-apiserver (deploy/kustomize/base/policies).

* ``hami-scheduler-owned``: a tenant cannot write the scheduler's grant annotations and label, nor create a GPU
  pod already placed on a node, even with no mutating webhook registered at all (as when it is skipped or
  down); the scheduler's and the node's accounts can.
* ``hami-node-restriction``: the node DaemonSet's account, whose RBAC allows patching any pod and node, writes
  only its own Node and the pods bound to it, as told by its token's node-name claim.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from hami_common.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    GRANT_SIGNATURE,
    MIG_ALLOCATIONS,
    VGPU_NODE,
)
from hami_common.resources import GPU, GPU_MEMORY
from hami_sim.realk8s import (
    SYSTEM_NAMESPACE,
    ApiError,
    ControlPlane,
    apply,
    deployed,
    policy_documents,
    rbac_documents,
)

TENANT_NS = "team-a"
FORGED = "GPU-0,NVIDIA,80000,100:;"
MERGE = "application/merge-patch+json"
Json = dict[str, Any]


def _pod(name: str, *, gpu: bool = True, node: str = "", annotations: dict[str, str] | None = None) -> Json:
    limits = {GPU: "1", GPU_MEMORY: "3000"} if gpu else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **({"annotations": annotations} if annotations else {})},
        "spec": {
            **({"nodeName": node} if node else {}),
            "containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": limits}}],
        },
    }


def _node(plane: ControlPlane, name: str) -> None:
    try:
        plane.create("", "v1", "nodes", None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    except ApiError as err:
        if err.status != 409:
            raise


@pytest.fixture(scope="module")
def policies(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The deployed RBAC and policies applied; tokens of a tenant (may edit pods in team-a), of the
    scheduler, and of the node account bound to node p1 / not bound. The policies are removed afterwards, as
    other tests on this apiserver write annotations as the admin."""
    admin = plane.write_kubeconfig(tmp_path_factory.mktemp("policies") / "admin")
    documents = deployed(plane.binaries)
    apply(plane.binaries, admin, rbac_documents(documents))
    apply(plane.binaries, admin, policy_documents(documents))
    plane.ensure_namespace(TENANT_NS)
    plane.create("", "v1", "serviceaccounts", TENANT_NS, {"metadata": {"name": "dev"}})
    # what the aggregated ClusterRole "edit" grants on pods (aggregation needs kube-controller-manager)
    role = {
        "metadata": {"name": "pod-editor"},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "patch", "update"]},
            # more than "edit" grants, as a cluster's own controller accounts may hold: the keys stay guarded
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
            {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
        ],
    }
    plane.create("rbac.authorization.k8s.io", "v1", "roles", TENANT_NS, role)
    binding = {
        "metadata": {"name": "dev-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-editor"},
        "subjects": [{"kind": "ServiceAccount", "name": "dev", "namespace": TENANT_NS}],
    }
    plane.create("rbac.authorization.k8s.io", "v1", "rolebindings", TENANT_NS, binding)
    for name in ("p1", "p2"):
        _node(plane, name)
    tokens = {
        "tenant": plane.token(TENANT_NS, "dev"),
        "scheduler": plane.token(SYSTEM_NAMESPACE, "hami-scheduler"),
        "node-p1": plane.token(SYSTEM_NAMESPACE, "hami-node", node="p1"),
        "node-unbound": plane.token(SYSTEM_NAMESPACE, "hami-node"),
    }
    _until_enforced(plane, tokens["tenant"])
    try:
        yield tokens
    finally:
        for doc in policy_documents(documents):
            plural = "validatingadmissionpolicies"
            if doc["kind"].endswith("Binding"):
                plural = "validatingadmissionpolicybindings"
            plane.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{plural}/{doc['metadata']['name']}")


def _until_enforced(plane: ControlPlane, tenant: str) -> None:
    """A new policy takes a moment to reach the admission chain: probe until the forged pod is refused."""
    deadline = time.monotonic() + 60
    probe = _pod("probe", annotations={DEVICES_TO_ALLOCATE: FORGED})
    while time.monotonic() < deadline:
        try:
            plane.request_as(tenant, "POST", f"/api/v1/namespaces/{TENANT_NS}/pods", probe)
        except ApiError as err:
            if "written by the HAMi scheduler only" in str(err):
                return
            raise
        plane.request("DELETE", f"/api/v1/namespaces/{TENANT_NS}/pods/probe", {"gracePeriodSeconds": 0})
        time.sleep(0.5)
    raise AssertionError("the policy was not enforced within 60 s")


def _refused(call: Any) -> str:
    with pytest.raises(ApiError) as caught:
        call()
    assert caught.value.status in (403, 422), caught.value
    return str(caught.value)


def _create(plane: ControlPlane, token: str, body: Json, namespace: str = TENANT_NS) -> Json:
    return plane.request_as(token, "POST", f"/api/v1/namespaces/{namespace}/pods", body)


def _patch(plane: ControlPlane, token: str, name: str, patch: Json, namespace: str = TENANT_NS) -> Json:
    return plane.request_as(token, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", patch, MERGE)


@pytest.mark.parametrize(
    "annotations",
    [
        pytest.param({DEVICES_TO_ALLOCATE: FORGED, DEVICES_ALLOCATED: FORGED, VGPU_NODE: "p1"}, id="a forged grant"),
        pytest.param({GRANT_SIGNATURE: "v1.AAAA"}, id="a made-up signature"),
        pytest.param({BIND_PHASE: "success"}, id="a bind phase"),
    ],
)
def test_a_tenant_cannot_create_a_pod_carrying_scheduler_owned_annotations(
    plane: ControlPlane, policies: dict[str, str], annotations: dict[str, str]
) -> None:
    message = _refused(lambda: _create(plane, policies["tenant"], _pod("forged", annotations=annotations)))
    assert "written by the HAMi scheduler only" in message
    for key in annotations:
        assert key in message


def test_a_tenant_cannot_create_a_gpu_pod_already_placed_on_a_node(
    plane: ControlPlane, policies: dict[str, str]
) -> None:
    message = _refused(lambda: _create(plane, policies["tenant"], _pod("placed", node="p1")))
    assert "must be placed by the scheduler" in message
    # a pod without GPUs may still name its node, as Kubernetes allows
    _create(plane, policies["tenant"], _pod("cpu-placed", gpu=False, node="p1"))


def test_a_tenant_cannot_add_change_or_remove_what_the_scheduler_wrote(
    plane: ControlPlane, policies: dict[str, str]
) -> None:
    tenant, scheduler = policies["tenant"], policies["scheduler"]
    _create(plane, tenant, _pod("job"))
    _refused(lambda: _patch(plane, tenant, "job", {"metadata": {"annotations": {DEVICES_TO_ALLOCATE: FORGED}}}))
    # the scheduler's account writes the grant, as the extender's Filter does
    grant = {VGPU_NODE: "p1", DEVICES_ALLOCATED: "GPU-0,NVIDIA,3000,0:;", GRANT_SIGNATURE: "v1.c2lnbmVk"}
    _patch(plane, scheduler, "job", {"metadata": {"annotations": grant, "labels": {VGPU_NODE: "p1"}}})
    _refused(lambda: _patch(plane, tenant, "job", {"metadata": {"annotations": {DEVICES_ALLOCATED: FORGED}}}))
    _refused(lambda: _patch(plane, tenant, "job", {"metadata": {"annotations": {GRANT_SIGNATURE: None}}}))
    # the label the webhook's quota view selects on cannot be dropped to hide the pod's usage
    message = _refused(lambda: _patch(plane, tenant, "job", {"metadata": {"labels": {VGPU_NODE: None}}}))
    assert "hami.io/vgpu-node" in message
    # the tenant's own annotations and labels stay the tenant's
    _patch(plane, tenant, "job", {"metadata": {"annotations": {"team": "a"}, "labels": {"app": "train"}}})
    stored = plane.request("GET", f"/api/v1/namespaces/{TENANT_NS}/pods/job")["metadata"]
    assert stored["annotations"][DEVICES_ALLOCATED] == grant[DEVICES_ALLOCATED]
    assert stored["labels"][VGPU_NODE] == "p1"


def test_pods_status_and_pods_binding_cannot_write_what_the_scheduler_owns(
    plane: ControlPlane, policies: dict[str, str]
) -> None:
    """Issue 28 item 7: an account with pods/status rights erased the signed grant, wrote a to-allocate list
    and dropped the hami.io/vgpu-node label; kube-apiserver also copies a Binding's annotations onto the pod.
    Both subresources are guarded now, and a plain Binding (what kube-scheduler posts) still binds."""
    tenant, scheduler = policies["tenant"], policies["scheduler"]
    _create(plane, tenant, _pod("held"))
    grant = {VGPU_NODE: "p1", DEVICES_ALLOCATED: "GPU-0,NVIDIA,3000,0:;", GRANT_SIGNATURE: "v1.c2lnbmVk"}
    _patch(plane, scheduler, "held", {"metadata": {"annotations": grant, "labels": {VGPU_NODE: "p1"}}})
    status = f"/api/v1/namespaces/{TENANT_NS}/pods/held/status"
    for patch in (
        {"metadata": {"annotations": {GRANT_SIGNATURE: None}}},
        {"metadata": {"annotations": {DEVICES_TO_ALLOCATE: FORGED}}},
        {"metadata": {"labels": {VGPU_NODE: None}}},
    ):
        message = _refused(lambda patch=patch: plane.request_as(tenant, "PATCH", status, patch, MERGE))
        assert "written by the HAMi scheduler only" in message
    # the status itself is still the status writer's
    plane.request_as(tenant, "PATCH", status, {"status": {"conditions": []}}, MERGE)
    stored = plane.request("GET", f"/api/v1/namespaces/{TENANT_NS}/pods/held")["metadata"]
    assert stored["annotations"][GRANT_SIGNATURE] == grant[GRANT_SIGNATURE]
    assert stored["labels"][VGPU_NODE] == "p1"
    assert DEVICES_TO_ALLOCATE not in stored["annotations"]

    def bind(name: str, annotations: dict[str, str]) -> Json:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, **({"annotations": annotations} if annotations else {})},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "p1"},
        }
        return plane.request_as(tenant, "POST", f"/api/v1/namespaces/{TENANT_NS}/pods/{name}/binding", body)

    _create(plane, tenant, _pod("bound-with-a-grant"))
    message = _refused(lambda: bind("bound-with-a-grant", {DEVICES_TO_ALLOCATE: FORGED, DEVICES_ALLOCATED: FORGED}))
    assert "written by the HAMi scheduler only" in message
    assert not plane.request("GET", f"/api/v1/namespaces/{TENANT_NS}/pods/bound-with-a-grant")["spec"].get("nodeName")
    _create(plane, tenant, _pod("plain-bind", gpu=False))
    bind("plain-bind", {})
    assert plane.request("GET", f"/api/v1/namespaces/{TENANT_NS}/pods/plain-bind")["spec"]["nodeName"] == "p1"


def test_the_node_account_writes_only_its_own_node_and_the_pods_bound_to_it(
    plane: ControlPlane, policies: dict[str, str]
) -> None:
    for name, node in (("on-p1", "p1"), ("on-p2", "p2")):
        plane.create("", "v1", "pods", TENANT_NS, _pod(name, gpu=False, node=node))
    mine, unbound = policies["node-p1"], policies["node-unbound"]
    mark = {"metadata": {"annotations": {BIND_PHASE: "success"}}}
    _patch(plane, mine, "on-p1", mark)
    message = _refused(lambda: _patch(plane, mine, "on-p2", mark))
    assert "may write only pods bound to that node" in message

    node_mark = {"metadata": {"annotations": {"hami.io/node-handshake": "Reported 2026-12-01 00:00:00"}}}
    plane.request_as(mine, "PATCH", "/api/v1/nodes/p1", node_mark, MERGE)
    message = _refused(lambda: plane.request_as(mine, "PATCH", "/api/v1/nodes/p2", node_mark, MERGE))
    assert "may write only that Node" in message

    # on its own Node, annotations only (issue 28 item 8): not its taints, nor labels NodeRestriction keeps
    # even from the kubelet
    taint = {"key": "maintenance", "value": "yes", "effect": "NoSchedule"}
    plane.request("PATCH", "/api/v1/nodes/p1", {"spec": {"taints": [taint]}}, MERGE)
    for patch in (
        {"spec": {"taints": None}},
        {"spec": {"unschedulable": True}},
        {"metadata": {"labels": {"node-restriction.kubernetes.io/gpu-pool": "premium"}}},
    ):
        message = _refused(lambda patch=patch: plane.request_as(mine, "PATCH", "/api/v1/nodes/p1", patch, MERGE))
        assert "write only annotations of their Node" in message
    assert plane.request("GET", "/api/v1/nodes/p1")["spec"]["taints"] == [taint]
    plane.request("PATCH", "/api/v1/nodes/p1", {"spec": {"taints": None}}, MERGE)

    # a token not bound to a node (no node-name claim) writes nothing; reading is still RBAC's business
    message = _refused(lambda: _patch(plane, unbound, "on-p1", mark))
    assert "no node-name claim" in message
    _refused(lambda: plane.request_as(unbound, "PATCH", "/api/v1/nodes/p1", node_mark, MERGE))
    assert plane.request_as(unbound, "GET", "/api/v1/nodes/p2")["metadata"]["name"] == "p2"


def test_the_node_account_records_mig_ids_on_its_own_pods_only_and_a_tenant_cannot(
    plane: ControlPlane, policies: dict[str, str]
) -> None:
    """The scheduler writes ``hami.io/vgpu-mig-allocations``; the allocator of the pod's node adds the ids of
    the instances it created (hami-protocol §2.6). Another node's account and the tenant may not touch it."""
    reserved = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-0","profile":"1g.10gb","placement":{"start":6,"size":1}}]'
    )
    realised = reserved[:-2] + ',"migUUID":"MIG-0","gpuInstanceID":13,"computeInstanceID":0}]'
    tenant, scheduler, mine = policies["tenant"], policies["scheduler"], policies["node-p1"]
    for name, node in (("mig-on-p1", "p1"), ("mig-on-p2", "p2")):
        plane.create("", "v1", "pods", TENANT_NS, _pod(name, gpu=False, node=node))
        _patch(plane, scheduler, name, {"metadata": {"annotations": {MIG_ALLOCATIONS: reserved}}})
    ids = {"metadata": {"annotations": {MIG_ALLOCATIONS: realised}}}
    _patch(plane, mine, "mig-on-p1", ids)
    assert "may write only pods bound to that node" in _refused(lambda: _patch(plane, mine, "mig-on-p2", ids))
    message = _refused(lambda: _patch(plane, tenant, "mig-on-p2", ids))
    assert MIG_ALLOCATIONS in message
    stored = plane.request("GET", f"/api/v1/namespaces/{TENANT_NS}/pods/mig-on-p1")["metadata"]["annotations"]
    assert stored[MIG_ALLOCATIONS] == realised
