"""A HAMi GPU pod in DRA mode goes all the way to allocated and bound on the real control plane (docs/dra.md).

Real kube-apiserver, kube-controller-manager (resourceclaim controller + garbage collector) and kube-scheduler
with no extender; our webhook in DRA mode; the deployed DeviceClass (deploy/kustomize/components/dra); and
the ResourceSlices our node agent's publisher writes for a node with one fake 10000 MiB GPU, beside a node
without GPUs. The pods are written for HAMi (``nvidia.com/gpu: 1, nvidia.com/gpumem: 3000``): the resourceclaim
controller makes each its claim from the webhook's template, kube-scheduler allocates it from our slices with
the capacity it consumes and binds the pod. Three share the card; the fourth does not fit and stays pending
with the scheduler's reason until one of the three is deleted, its claim with it.

This plane is the module's own: a default scheduler and a garbage collector must not act on the objects of
the tests sharing the session's plane.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
import pytest
import yaml

from hami_common.dra.names import DRIVER
from hami_common.dra.objects import ResourceSlice
from hami_common.dra.slices import MIB, node_slices, slice_name
from hami_common.errors import Forbidden
from hami_common.inventory import FakeInventory
from hami_common.kube import KubeClient, KubeSettings
from hami_common.quantity import value
from hami_common.resources import GPU, GPU_MEMORY
from hami_nodeagent.draslices import KubeSlices, SlicePublisher
from hami_sim.realk8s import (
    SYSTEM_NAMESPACE,
    ApiError,
    ControlPlane,
    K8sBinaries,
    KubeControllerManager,
    KubeScheduler,
    apply,
    deployed,
    policy_documents,
    rbac_documents,
    repo_root,
    webhook_configuration,
)
from hami_sim.waiting import eventually_sync
from tests.realk8s.conftest import controller_manager_or_skip
from tests.webhook.conftest import TlsFiles, offline_settings
from tests.webhook.support import container, pod, served, write_self_signed

Json = dict[str, Any]
TENANT: Final = "dra-jobs"
GPU_NODE: Final = "dra-gpu-node"
CPU_NODE: Final = "dra-cpu-node"
CARD_MIB: Final = 10000
ASK_MIB: Final = 3000
NODE_SLICE_POLICY: Final = "hami-node-resourceslices"  # deploy/kustomize/components/dra/policy.yaml
PODS: Final = f"/api/v1/namespaces/{TENANT}/pods"
SLICES: Final = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS: Final = f"/apis/resource.k8s.io/v1/namespaces/{TENANT}/resourceclaims"
MERGE: Final = "application/merge-patch+json"
WAIT_S: Final = 90.0  # a 2-core machine shared with others; scheduling itself takes well under a second


@dataclass(frozen=True)
class DraCluster:
    plane: ControlPlane
    publisher: SlicePublisher
    node_token: str  # the node account's, bound to GPU_NODE


def _node(plane: ControlPlane, name: str) -> None:
    # what a kubelet reports; without pods allocatable kube-scheduler finds no room for any pod
    room = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"capacity": room, "allocatable": room},
    }
    plane.create("", "v1", "nodes", None, node)


def _inventory(folder: Path) -> Path:
    gpu = {"uuid": "GPU-dra-0", "index": 0, "model": "NVIDIA A10", "memory_mib": CARD_MIB, "numa": 0}
    path = folder / "inventory.yaml"
    path.write_text(yaml.safe_dump({"nodes": {GPU_NODE: [gpu], CPU_NODE: []}}))
    return path


def _dra_deployment(k8s: K8sBinaries, folder: Path) -> list[Json]:
    """deploy/kustomize/base with the dra component, as an operator's overlay adds it."""
    kustomize = repo_root() / "deploy" / "kustomize"
    overlay = folder / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(kustomize / "base", overlay)],
                "components": [os.path.relpath(kustomize / "components" / "dra", overlay)],
            }
        )
    )
    return deployed(k8s, overlay)


async def _publish(kubeconfig: Path, inventory: Path) -> SlicePublisher:
    async with KubeClient.from_settings(KubeSettings(kubeconfig=str(kubeconfig))) as kube:
        publisher = SlicePublisher(node=GPU_NODE, inventory=FakeInventory(inventory, GPU_NODE), store=KubeSlices(kube))
        await publisher.sync()
        await publisher.sync(check=True)  # a second, checking pass writes nothing: the apiserver kept our slice
        return publisher


@pytest.fixture(scope="module")
def dra_cluster(k8s: K8sBinaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraCluster]:
    controller_manager_or_skip(k8s)
    folder = tmp_path_factory.mktemp("dra-allocation")
    documents = _dra_deployment(k8s, folder)
    with ControlPlane(folder / "plane", k8s) as plane:
        admin = plane.write_kubeconfig(folder / "admin")
        plane.ensure_namespace(TENANT)
        # the shipped accounts, their RBAC, the DeviceClass and the slice policy; base's pod and node policies
        # are tested in test_admission_policies.py
        dra_policy = [d for d in policy_documents(documents) if d["metadata"]["name"] == NODE_SLICE_POLICY]
        apply(k8s, admin, [*rbac_documents(documents), *_of_kind(documents, "DeviceClass"), *dra_policy])
        _node(plane, GPU_NODE)
        _node(plane, CPU_NODE)
        # the node agent publishes as the node DaemonSet's account, with a token bound to its node
        node_token = plane.token(SYSTEM_NAMESPACE, "hami-node", node=GPU_NODE)
        node_kubeconfig = plane.write_token_kubeconfig(folder / "node", node_token)
        publisher = eventually_sync(  # the policy takes effect once the apiserver's informer has it
            lambda: _published_or_none(node_kubeconfig, _inventory(folder)), what="the node agent publishes"
        )

        tls = TlsFiles(folder / "tls.crt", folder / "tls.key")
        write_self_signed(tls.cert, tls.key)
        controllers = KubeControllerManager(k8s, folder / "kcm", admin)
        scheduler_config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(admin)},
            "leaderElection": {"leaderElect": False},
        }
        scheduler = KubeScheduler(k8s, folder / "scheduler", scheduler_config, name="default-scheduler")
        # the webhook writes templates as its own account: the component's RBAC must suffice
        webhook_kubeconfig = plane.write_token_kubeconfig(
            folder / "webhook", plane.token(SYSTEM_NAMESPACE, "hami-webhook")
        )
        with served(offline_settings(tls, dra=True, kubeconfig=str(webhook_kubeconfig)), tls.cert) as webhook:
            # the component's registration as shipped (sideEffects: NoneOnDryRun), pointed at this webhook
            apply(k8s, admin, [webhook_configuration(documents, webhook.url, tls.cert.read_bytes())])
            probe = _pod("probe")
            eventually_sync(
                lambda: "resourceClaims" in plane.request("POST", f"{PODS}?dryRun=All", probe)["spec"],
                what="kube-apiserver calls the DRA-mode webhook",
            )
            controllers.start()
            scheduler.start()
            try:
                yield DraCluster(plane, publisher, node_token)
            finally:
                scheduler.stop()
                controllers.stop()


def _of_kind(documents: list[Json], kind: str) -> list[Json]:
    return [d for d in documents if d["kind"] == kind]


def _published_or_none(kubeconfig: Path, inventory: Path) -> SlicePublisher | None:
    try:
        return asyncio.run(_publish(kubeconfig, inventory))
    except Forbidden:
        return None


def _pod(name: str) -> Json:
    body = pod(container(limits={GPU: "1", GPU_MEMORY: str(ASK_MIB)}), name=name, namespace=TENANT)
    body.pop("status")
    return body


def _bound_claim(plane: ControlPlane, name: str) -> Json | None:
    """The pod's allocated claim once the pod is bound, else None."""
    current = plane.request("GET", f"{PODS}/{name}")
    statuses = current.get("status", {}).get("resourceClaimStatuses") or []
    if not current["spec"].get("nodeName") or not statuses:
        return None
    claim = plane.request("GET", f"{CLAIMS}/{statuses[0]['resourceClaimName']}")
    return claim if claim.get("status", {}).get("allocation") else None


def _unschedulable_reason(plane: ControlPlane, name: str) -> str | None:
    conditions = plane.request("GET", f"{PODS}/{name}").get("status", {}).get("conditions") or []
    return next(
        (c.get("message", "") for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"), None
    )


def test_the_published_slice_passes_v1_validation_as_hami_dra_shapes_it(dra_cluster: DraCluster) -> None:
    stored = dra_cluster.plane.request("GET", f"{SLICES}/{slice_name(GPU_NODE, 0)}")
    spec = stored["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (DRIVER, GPU_NODE, GPU_NODE)
    [device] = spec["devices"]
    assert device["name"] == "hami-gpu-0"
    assert device["attributes"]["type"] == {"string": "hami-gpu"}
    assert device["allowMultipleAllocations"] is True
    assert stored["metadata"]["ownerReferences"][0]["name"] == GPU_NODE
    assert dra_cluster.publisher.writes == 1  # the checking pass found it intact


def test_the_node_account_writes_only_its_own_nodes_slices_of_hamis_driver(dra_cluster: DraCluster) -> None:
    plane = dra_cluster.plane
    devices = dra_cluster.publisher.devices
    [other] = node_slices(CPU_NODE, devices, generation=1)
    [mine] = node_slices(GPU_NODE, devices, generation=1)
    foreign = msgspec.structs.replace(mine, spec=msgspec.structs.replace(mine.spec, driver="gpu.example.com"))

    def refused(token: str, body: ResourceSlice) -> str | None:
        try:  # a dry run: admission judges it, nothing is stored
            plane.request_as(token, "POST", f"{SLICES}?dryRun=All", msgspec.to_builtins(body))
        except ApiError as err:
            return f"{err.status} {err}"
        return None

    def forbidden(message: str | None, why: str) -> None:
        assert message is not None
        assert message.startswith("403 "), message
        assert why in message, message

    message = eventually_sync(lambda: refused(dra_cluster.node_token, other), WAIT_S, "another node's slice refused")
    forbidden(message, "may write only the ResourceSlices of that node")
    forbidden(refused(dra_cluster.node_token, foreign), "publish only the driver")
    unbound = plane.token(SYSTEM_NAMESPACE, "hami-node")  # a token not bound to a node
    forbidden(refused(unbound, mine), "no node-name claim")
    # its own node's, of HAMi's driver, under a name not taken yet: allowed
    spare = msgspec.structs.replace(mine, metadata=msgspec.structs.replace(mine.metadata, name=slice_name(GPU_NODE, 9)))
    assert refused(dra_cluster.node_token, spare) is None


def test_three_hami_pods_share_one_card_the_fourth_waits_until_one_is_deleted(dra_cluster: DraCluster) -> None:
    plane = dra_cluster.plane
    names = [f"infer-{i}" for i in range(4)]
    for name in names[:3]:
        plane.request("POST", PODS, _pod(name))
    claims = {n: eventually_sync(functools.partial(_bound_claim, plane, n), WAIT_S, f"{n} bound") for n in names[:3]}

    shares: set[str] = set()
    for name, claim in claims.items():
        assert plane.request("GET", f"{PODS}/{name}")["spec"]["nodeName"] == GPU_NODE
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["device"]) == (DRIVER, GPU_NODE, "hami-gpu-0")
        # the apiserver writes quantities canonically (3145728k): compare their values
        consumed = result["consumedCapacity"]
        assert value(consumed["memory"]) == ASK_MIB * MIB
        assert value(consumed["cores"]) == 0
        shares.add(result["shareID"])
        assert claim["metadata"]["ownerReferences"][0]["name"] == name  # made by the controller, owned by the pod
    assert len(shares) == 3  # three allocations of one device, each its own share

    plane.request("POST", PODS, _pod(names[3]))
    reason = eventually_sync(lambda: _unschedulable_reason(plane, names[3]), WAIT_S, "the fourth pod refused")
    assert "cannot allocate all claims" in reason, reason
    assert "2 nodes" in reason or "0/2" in reason, reason

    plane.request("DELETE", f"{PODS}/{names[0]}", {"gracePeriodSeconds": 0})
    gone = claims[names[0]]["metadata"]["name"]
    eventually_sync(lambda: _missing(plane, f"{CLAIMS}/{gone}"), WAIT_S, "the deleted pod's claim deleted")
    claim = eventually_sync(lambda: _bound_claim(plane, names[3]), WAIT_S, "the fourth pod bound")
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "hami-gpu-0"


def _missing(plane: ControlPlane, path: str) -> bool:
    try:
        plane.request("GET", path)
    except ApiError as err:
        return err.status == 404
    return False
