"""200 pods through the whole path: webhook, scheduler stand-in, extender, NATS, node agent, allocator, kubelet."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from hami_common.kube import Pod
from hami_sim.stack import LocalCluster
from hami_sim.stack.audit import audit as audit_cluster
from hami_sim.stack.audit import mixed_workload, usage_by_gpu
from hami_sim.waiting import eventually

MIB = 1 << 20
PODS = 200


async def our_pods(cluster: LocalCluster, uids: set[str]) -> list[Pod]:
    pods, _ = await cluster.kube.list_pods()
    return [p for p in pods if p.metadata.uid in uids]


def allocated_bytes(exposition: str) -> dict[str, float]:
    """``hami_gpu_memory_allocated_bytes`` per GPU UUID from a Prometheus text exposition."""
    found: dict[str, float] = {}
    for line in exposition.splitlines():
        if not line.startswith("hami_gpu_memory_allocated_bytes{"):
            continue
        labels, value = line.rsplit(" ", 1)
        uuid = labels.split('device_uuid="', 1)[1].split('"', 1)[0]
        found[uuid] = float(value)
    return found


@pytest.mark.timeout(240)
async def test_two_hundred_pods_get_exactly_their_annotated_devices_and_every_layer_agrees(
    cluster: LocalCluster,
) -> None:
    created = await asyncio.gather(*(cluster.submit(pod) for pod in mixed_workload(PODS)))
    uids = {pod["metadata"]["uid"] for pod in created}
    async with asyncio.timeout(180):
        admitted = await cluster.wait_admitted(uids)

    assert all(a.admission.ok for a in admitted.values()), [
        a.admission for a in admitted.values() if not a.admission.ok
    ]
    pods = await our_pods(cluster, uids)
    report = audit_cluster(pods, admitted, cluster.capacity())
    assert report.problems == []
    assert report.allocated == PODS

    usage = usage_by_gpu(pods)
    ledger = cluster.ledger()
    assert ledger is not None
    state = ledger.state()
    assert uids <= state.bookings.keys()
    booked = {d.id: (d.usedmem, d.usedcores) for usage_ in state.nodes.values() for d in usage_.devices if d.used}
    assert booked == {uuid: (mem, cores) for uuid, (mem, cores, _) in usage.items()}

    async def metrics_agree() -> bool:
        async with httpx.AsyncClient() as client:
            text = (await client.get(cluster.metrics_url)).text
        seen = allocated_bytes(text)
        return all(seen.get(uuid) == mem * MIB for uuid, (mem, _, _) in usage.items())

    await eventually(metrics_agree, timeout=30, what="the metrics service shows every allocation")

    async def all_running() -> bool:
        return all(p.status.phase == "Running" for p in await our_pods(cluster, uids))

    await eventually(all_running, timeout=30, what="the kubelets report every admitted pod Running")
    assert cluster.failures() == {}
