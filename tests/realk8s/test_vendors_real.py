"""Ascend, Cambricon and Hygon pods on the real control plane, wired by the deployed manifests: the real
kube-apiserver calls our webhook for them (its matchConditions), the deployed KubeSchedulerConfiguration
sends them to our extender (its managedResources), each lands on its vendor's node with the vendor's
placement annotations, and a tenant may not write those annotations itself (the webhook and the deployed
ValidatingAdmissionPolicy). The emulated twin is tests/e2e/test_vendors.py."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Final

import pytest
import yaml

from hami_common.annotations import VGPU_NODE
from hami_common.resources import BAD_QUANTITY, INT32_MAX
from hami_common.scheduling.usage import DeviceUsage
from hami_common.vendors import DeviceFamily, NodeView
from hami_common.vendors.plugin import fake_vendors
from hami_sim.realk8s import K8sBinaries
from hami_sim.stack import LocalCluster, StackConfig
from hami_webhook.admission import ALL_ADDED, NODE_ASSIGNED, PRIVILEGED

ROOT: Final = Path(__file__).resolve().parents[2]
VENDORS: Final = ("ascend", "cambricon", "hygon")
HAMI_SCHEDULER: Final = "hami-scheduler"


def _kubectl(k8s: K8sBinaries, cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [k8s["kubectl"], "--kubeconfig", str(cluster.config.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _example(vendor: str) -> Path:
    return ROOT / "examples" / "vendors" / f"{vendor}.yaml"


def _family_of(cluster: LocalCluster, annotations: Mapping[str, str]) -> DeviceFamily:
    """The configured family whose allocated annotation the pod carries (exactly one)."""
    found = [f for f in cluster.config.device_config().families if any(f.allocated(annotations))]
    assert len(found) == 1, f"families with devices on the pod: {[f.word for f in found]}"
    return found[0]


async def _node_devices(cluster: LocalCluster, family: DeviceFamily, node: str) -> dict[str, DeviceUsage]:
    found = await cluster.kube.get_node(node)
    view = NodeView(
        name=node,
        annotations=dict(found.metadata.annotations or {}),
        capacity=found.status.capacity,
        allocatable=found.status.allocatable,
    )
    return {device.id: device for device in family.node_devices(view)}


@pytest.fixture
async def vendor_cluster(k8s: K8sBinaries, tmp_path: Path, sockdir: Path) -> AsyncIterator[LocalCluster]:
    config = StackConfig(
        workdir=tmp_path / "stack",
        sockdir=sockdir,
        nodes=1,
        gpus_per_node=2,
        kube="real",
        vendors=VENDORS,
        vendor_devices_per_node=2,
        node_hosts=1,
    )
    async with LocalCluster(config) as running:
        yield running


@pytest.mark.timeout(600)
async def test_each_vendor_example_is_admitted_routed_and_placed_on_its_vendors_node(
    vendor_cluster: LocalCluster, k8s: K8sBinaries
) -> None:
    cluster = vendor_cluster
    uids: dict[str, str] = {}
    for vendor in VENDORS:
        done = await asyncio.to_thread(_kubectl, k8s, cluster, "apply", "-n", "default", "-f", str(_example(vendor)))
        assert done.returncode == 0, done.stderr
        name = yaml.safe_load(_example(vendor).read_text())["metadata"]["name"]
        pod = await cluster.kube.get_pod("default", name)
        assert pod.spec.scheduler_name == HAMI_SCHEDULER, f"{vendor}: the apiserver did not call our webhook"
        uids[vendor] = pod.metadata.uid

    async with asyncio.timeout(240):
        admitted = await cluster.wait_admitted(uids.values())

    pods, _ = await cluster.kube.list_pods()
    by_uid = {p.metadata.uid: p for p in pods}
    for vendor, uid in uids.items():
        node = f"{vendor}-node-0"
        got = admitted[uid]
        assert got.admission.ok, (vendor, got.admission)
        pod = by_uid[uid]
        assert pod.spec.node_name == node == got.node, vendor
        annotations = dict(pod.metadata.annotations or {})
        assert annotations.get(VGPU_NODE) == node
        family = _family_of(cluster, annotations)
        assert family.owned_annotations & annotations.keys(), f"{vendor}: no placement annotation written"
        # audit: every granted device is one the node registers (as the extender reads it), within its
        # memory and cores
        devices = await _node_devices(cluster, family, node)
        granted = [device for container in family.allocated(annotations) for device in container]
        assert granted, f"{vendor}: no device granted"
        for device in granted:
            assert device.uuid in devices, f"{vendor}: {device.uuid} is not on {node}"
            card = devices[device.uuid]
            assert 0 < device.usedmem <= card.totalmem, f"{vendor}: {device} over-commits {card}"
            assert device.usedcores <= card.totalcore, f"{vendor}: {device} over-commits {card}"
    assert cluster.failures() == {}


@pytest.mark.timeout(600)
async def test_a_tenant_pod_that_writes_a_vendors_placement_annotation_is_refused(
    vendor_cluster: LocalCluster, k8s: K8sBinaries, tmp_path: Path
) -> None:
    families = vendor_cluster.config.device_config().families
    plugin_words = {fake.vendor for fake in fake_vendors().values()}
    assert plugin_words >= set(VENDORS)
    for family in families:
        # a key the vendor's device plugin trusts, not one under hami.io/ (those were always guarded)
        keys = sorted(k for k in family.owned_annotations if not k.startswith("hami.io/"))
        key = keys[0] if keys else sorted(family.owned_annotations)[0]
        name = f"forged-{family.word.lower()}"
        manifest = tmp_path / f"{name}.yaml"
        limits = {family.resource_names[0]: 1}
        manifest.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "namespace": "default", "annotations": {key: "forged"}},
                    "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]},
                }
            )
        )
        done = await asyncio.to_thread(_kubectl, k8s, vendor_cluster, "apply", "-f", str(manifest))
        assert done.returncode != 0, f"{family.word}: a pod setting {key} was created"
        assert key in done.stderr, done.stderr
        absent = await asyncio.to_thread(_kubectl, k8s, vendor_cluster, "get", "pod", "-n", "default", name)
        assert absent.returncode != 0
        await _every_admission_rule_covers(vendor_cluster, k8s, tmp_path, family)


async def _every_admission_rule_covers(
    cluster: LocalCluster, k8s: K8sBinaries, tmp_path: Path, family: DeviceFamily
) -> None:
    """Issue 28 item 2 (and items 1a and 3 for this family): a vendor pod is under the same rules as an NVIDIA
    one. Each pod below is refused by kube-apiserver, through our webhook or the deployed policies."""
    resource = family.resource_names[0]
    word = family.word.lower()
    plain = {"name": "main", "image": "busybox", "resources": {"limits": {resource: 1}}}
    huge = "2147483648"
    refused = {
        # a vendor pod already placed on a node would skip the scheduler and its grant
        f"placed-{word}": ({"nodeName": "gpu-node-0", "containers": [plain]}, NODE_ASSIGNED),
        f"privileged-{word}": (
            {"containers": [{**plain, "securityContext": {"privileged": True}}]},
            PRIVILEGED.format(name="main"),
        ),
        f"allcaps-{word}": (
            {"containers": [{**plain, "securityContext": {"capabilities": {"add": ["ALL"]}}}]},
            ALL_ADDED.format(name="main", written="ALL"),
        ),
        f"huge-{word}": (
            {"containers": [{**plain, "resources": {"limits": {resource: huge}}}]},
            BAD_QUANTITY.format(resource=resource, value=huge, name="main", why="it is too large", high=INT32_MAX),
        ),
    }
    for name, (spec, said) in refused.items():
        manifest = tmp_path / f"{name}.yaml"
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}
        manifest.write_text(yaml.safe_dump(body))
        done = await asyncio.to_thread(_kubectl, k8s, cluster, "apply", "-f", str(manifest))
        assert done.returncode != 0, f"{family.word}: {name} was created"
        assert said in done.stderr, (name, done.stderr)
