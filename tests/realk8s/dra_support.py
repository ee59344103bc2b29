"""A DRA-mode cluster on a real control plane of its own, for tests/realk8s/test_dra_*.py (docs/dra.md).

kube-apiserver; kube-controller-manager with the resourceclaim controller and the garbage collector;
kube-scheduler as the cluster's default scheduler, with no extender; deploy/kustomize/base with the dra
component applied as rendered (accounts, RBAC, DeviceClass, the node account's slice policy); our webhook in
DRA mode running as its own account, registered as the component ships it; Nodes as a kubelet reports them;
and for each node with GPUs, the node agent's publisher writing its slices as the node account, with a token
bound to that node.

The plane is the module's own: a default scheduler and a garbage collector must not act on the objects of
the tests sharing the session's plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from hami_common.errors import Forbidden
from hami_common.inventory import FakeInventory
from hami_common.kube import KubeClient, KubeSettings
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
from tests.webhook.conftest import TlsFiles, offline_settings
from tests.webhook.support import container, pod, served, write_self_signed

__all__ = ["NODE_SLICE_POLICY", "SLICES", "WAIT_S", "DraCluster", "dra_cluster", "missing"]

Json = dict[str, Any]
NODE_SLICE_POLICY: Final = "hami-node-resourceslices"  # deploy/kustomize/components/dra/policy.yaml
SLICES: Final = "/apis/resource.k8s.io/v1/resourceslices"
WAIT_S: Final = 90.0  # a 2-core machine shared with others; scheduling itself takes well under a second


@dataclass(frozen=True)
class DraCluster:
    plane: ControlPlane
    namespace: str
    inventory: Path  # the fake inventory the publishers read: rewrite it to change a node's GPUs
    node_kubeconfigs: dict[str, Path]  # per GPU node: the node account, its token bound to that node
    node_tokens: dict[str, str]
    publishers: dict[str, SlicePublisher]  # as they stood after the first publication

    @property
    def pods(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    @property
    def claims(self) -> str:
        return f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaims"

    def hami_pod(self, name: str, limits: Mapping[str, str], annotations: Mapping[str, str] | None = None) -> Json:
        """A pod written for HAMi (its resource names and annotations), as a user applies it."""
        body = pod(
            container(limits=dict(limits)),
            name=name,
            namespace=self.namespace,
            annotations=dict(annotations) if annotations else None,
        )
        body.pop("status")
        return body

    def create_pod(self, name: str, limits: Mapping[str, str], annotations: Mapping[str, str] | None = None) -> Json:
        return self.plane.request("POST", self.pods, self.hami_pod(name, limits, annotations))

    def bound_claim(self, name: str) -> Json | None:
        """The pod's allocated claim once the pod is bound, else None."""
        current = self.plane.request("GET", f"{self.pods}/{name}")
        statuses = current.get("status", {}).get("resourceClaimStatuses") or []
        if not current["spec"].get("nodeName") or not statuses:
            return None
        claim = self.plane.request("GET", f"{self.claims}/{statuses[0]['resourceClaimName']}")
        return claim if claim.get("status", {}).get("allocation") else None

    def wait_bound(self, name: str) -> Json:
        return eventually_sync(lambda: self.bound_claim(name), WAIT_S, f"pod {name} allocated and bound")

    def unschedulable_reason(self, name: str) -> str | None:
        """kube-scheduler's message on the pod's PodScheduled=False condition, None until it wrote one."""
        conditions = self.plane.request("GET", f"{self.pods}/{name}").get("status", {}).get("conditions") or []
        return next(
            (c.get("message", "") for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"),
            None,
        )

    def wait_unschedulable(self, name: str) -> str:
        return eventually_sync(lambda: self.unschedulable_reason(name), WAIT_S, f"pod {name} found unschedulable")

    def delete_pod(self, name: str) -> None:
        # no kubelet runs: without a zero grace period the pod would stay Terminating on its node
        self.plane.request("DELETE", f"{self.pods}/{name}", {"gracePeriodSeconds": 0})

    def node_slices(self, node: str) -> list[Json]:
        items: list[Json] = self.plane.request("GET", f"{SLICES}?fieldSelector=spec.nodeName%3D{node}")["items"]
        return items

    def publish(self, node: str) -> SlicePublisher:
        """A node agent's publisher for ``node`` (a fresh one: it takes the node's slices over), synced once and
        checked once."""
        return asyncio.run(_publish(self.node_kubeconfigs[node], self.inventory, node))


def missing(plane: ControlPlane, path: str) -> bool:
    try:
        plane.request("GET", path)
    except ApiError as err:
        return err.status == 404
    return False


def _node(plane: ControlPlane, name: str) -> None:
    # what a kubelet reports; without pods allocatable kube-scheduler finds no room for any pod
    room = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"capacity": room, "allocatable": room},
    }
    plane.create("", "v1", "nodes", None, body)


def _dra_deployment(k8s: K8sBinaries, folder: Path) -> list[Json]:
    """deploy/kustomize/base with the dra component, as an operator's overlay adds it."""
    kustomize = repo_root() / "deploy" / "kustomize"
    overlay = folder / "overlay"
    overlay.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(kustomize / "base", overlay)],
        "components": [os.path.relpath(kustomize / "components" / "dra", overlay)],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return deployed(k8s, overlay)


async def _publish(kubeconfig: Path, inventory: Path, node: str) -> SlicePublisher:
    async with KubeClient.from_settings(KubeSettings(kubeconfig=str(kubeconfig))) as kube:
        publisher = SlicePublisher(node=node, inventory=FakeInventory(inventory, node), store=KubeSlices(kube))
        await publisher.sync()
        await publisher.sync(check=True)  # a checking pass: rewrites nothing if the apiserver kept the slices
        return publisher


def _publish_or_none(kubeconfig: Path, inventory: Path, node: str) -> SlicePublisher | None:
    try:
        return asyncio.run(_publish(kubeconfig, inventory, node))
    except Forbidden:
        return None  # the account's RBAC not yet seen by the apiserver's authorizer


@contextlib.contextmanager
def dra_cluster(
    k8s: K8sBinaries, folder: Path, gpus: Mapping[str, Sequence[Json]], namespace: str
) -> Iterator[DraCluster]:
    """The cluster, with a Node per key of ``gpus`` and the fake inventory's GPUs of each (none: a CPU node)."""
    documents = _dra_deployment(k8s, folder)
    inventory = folder / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"nodes": {node: list(declared) for node, declared in gpus.items()}}))
    with ControlPlane(folder / "plane", k8s) as plane:
        admin = plane.write_kubeconfig(folder / "admin")
        plane.ensure_namespace(namespace)
        # the shipped accounts, their RBAC, the DeviceClass and the slice policy; base's pod and node policies
        # are tested in test_admission_policies.py
        dra_policy = [d for d in policy_documents(documents) if d["metadata"]["name"] == NODE_SLICE_POLICY]
        classes = [d for d in documents if d["kind"] == "DeviceClass"]
        apply(k8s, admin, [*rbac_documents(documents), *classes, *dra_policy])
        kubeconfigs: dict[str, Path] = {}
        tokens: dict[str, str] = {}
        publishers: dict[str, SlicePublisher] = {}
        for node, declared in gpus.items():
            _node(plane, node)
            if not declared:
                continue
            tokens[node] = plane.token(SYSTEM_NAMESPACE, "hami-node", node=node)
            kubeconfigs[node] = plane.write_token_kubeconfig(folder / f"node-{node}", tokens[node])
            publishers[node] = eventually_sync(
                lambda node=node: _publish_or_none(kubeconfigs[node], inventory, node),  # type: ignore[misc]
                WAIT_S,
                f"the node agent of {node} publishes",
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
        webhook_token = plane.token(SYSTEM_NAMESPACE, "hami-webhook")
        webhook_kubeconfig = plane.write_token_kubeconfig(folder / "webhook", webhook_token)
        with served(offline_settings(tls, dra=True, kubeconfig=str(webhook_kubeconfig)), tls.cert) as webhook:
            # the component's registration as shipped (sideEffects: NoneOnDryRun), pointed at this webhook
            apply(k8s, admin, [webhook_configuration(documents, webhook.url, tls.cert.read_bytes())])
            cluster = DraCluster(plane, namespace, inventory, kubeconfigs, tokens, publishers)
            probe = cluster.hami_pod("probe", {"nvidia.com/gpu": "1"})
            eventually_sync(
                lambda: "resourceClaims" in plane.request("POST", f"{cluster.pods}?dryRun=All", probe)["spec"],
                what="kube-apiserver calls the DRA-mode webhook",
            )
            controllers.start()
            scheduler.start()
            try:
                yield cluster
            finally:
                scheduler.stop()
                controllers.stop()
