"""How often kube-apiserver calls our webhook for a GPU pod, as kube-apiserver counts it itself: once, at
its creation. Our own services' later writes (the extender's placement, the allocator's acknowledgement)
are not sent to it (the webhook would wave them through), while anyone else's update still is, and a
forged scheduler-owned annotation is still refused. And how many times our services write such a pod."""

from __future__ import annotations

import asyncio
import re

import pytest

from hami_common.annotations import BIND_PHASE, BIND_PHASE_SUCCESS, VGPU_NODE
from hami_sim.apicalls import api_calls
from hami_sim.realk8s import ApiError
from hami_sim.stack import LocalCluster
from hami_sim.stack.audit import mixed_workload
from hami_sim.waiting import eventually

HOOK = "vgpu.hami.io"
MERGE = "application/merge-patch+json"


def webhook_calls(cluster: LocalCluster, operation: str) -> float:
    assert cluster.real is not None
    return api_calls(cluster.real.plane.metrics_text()).webhooks.get(f"{HOOK} {operation}", 0.0)


@pytest.mark.timeout(300)
async def test_a_gpu_pod_reaches_the_webhook_at_its_creation_and_not_at_our_services_updates(
    real_cluster: LocalCluster,
) -> None:
    assert real_cluster.real is not None
    plane = real_cluster.real.plane
    creates, updates = webhook_calls(real_cluster, "CREATE"), webhook_calls(real_cluster, "UPDATE")
    before = api_calls(plane.metrics_text())
    pods = mixed_workload(12, prefix="calls")
    for body in pods[1::2]:  # half of them without labels, as a bare pod of kubectl apply
        del body["metadata"]["labels"]
    uids = [str((await real_cluster.submit(p))["metadata"]["uid"]) for p in pods]
    async with asyncio.timeout(120):
        admitted = await real_cluster.wait_admitted(uids)
    assert all(a.admission.ok for a in admitted.values())

    async def acknowledged() -> bool:  # placed, bound and acknowledged: patched by the extender and the allocator
        listed, _ = await real_cluster.kube.list_pods()
        ours = [p for p in listed if p.metadata.uid in uids]
        return len(ours) == len(uids) and all(
            p.spec.node_name and p.metadata.annotations.get(BIND_PHASE) == BIND_PHASE_SUCCESS for p in ours
        )

    await eventually(acknowledged, timeout=60, what="every pod acknowledged by its node")
    requests = (api_calls(plane.metrics_text()) - before).requests
    listed, _ = await real_cluster.kube.list_pods()
    placed = [p for p in listed if p.metadata.uid in uids]
    assert webhook_calls(real_cluster, "CREATE") - creates == len(pods)
    assert webhook_calls(real_cluster, "UPDATE") - updates == 0
    # the pod writes: a labelled pod's placement rides on its Binding, so the allocator's acknowledgement is
    # its one patch; a pod without labels is also patched by Filter. No acknowledgement is refused and read
    # again, and every pod carries HAMi's node label in the end.
    assert requests.get("POST pods/binding") == len(pods)
    assert requests.get("PATCH pods") == len(pods[::2]) + 2 * len(pods[1::2])
    assert requests.get("GET pods", 0) == 0
    assert all(p.metadata.labels.get(VGPU_NODE) == p.spec.node_name for p in placed)

    # anyone else's update of the same pods is still judged by the webhook
    one = placed[0].metadata
    path = f"/api/v1/namespaces/{one.namespace}/pods/{one.name}"
    await asyncio.to_thread(plane.request, "PATCH", path, {"metadata": {"labels": {"team": "a"}}}, MERGE)
    assert webhook_calls(real_cluster, "UPDATE") - updates == 1
    forged = {"metadata": {"annotations": {VGPU_NODE: "elsewhere"}}}
    with pytest.raises(ApiError, match=re.escape(HOOK)):
        await asyncio.to_thread(plane.request, "PATCH", path, forged, MERGE)
    assert webhook_calls(real_cluster, "UPDATE") - updates == 2
    kept = (await real_cluster.kube.get_pod(one.namespace, one.name)).metadata.annotations[VGPU_NODE]
    assert kept == one.annotations[VGPU_NODE]
