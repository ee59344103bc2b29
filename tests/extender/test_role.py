"""The scheduler pod's ``hami.io/scheduler-role`` label follows its leadership, as HAMi's scheduler labels its
pod: ``leader`` while the kube-scheduler beside it holds the Lease, ``follower`` once another pod does."""

from __future__ import annotations

import dataclasses
from typing import Any

from hami_common.annotations import SCHEDULER_ROLE, SCHEDULER_ROLE_FOLLOWER, SCHEDULER_ROLE_LEADER
from hami_extender.settings import ExtenderSettings
from hami_sim.kubeapi import KubeApiEmulator, find_resource
from hami_sim.waiting import eventually
from tests.extender.cluster import PODS, ensure_namespace
from tests.extender.conftest import serve

NAMESPACE = "hami-system"
POD = "hami-scheduler-7d9f-abcde"
LEASES = find_resource("coordination.k8s.io", "v1", "leases")


def _lease(holder: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "hami-scheduler", "namespace": NAMESPACE},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }


def _role(emulator: KubeApiEmulator) -> str:
    labels: dict[str, str] = emulator.store.get(PODS, NAMESPACE, POD)["metadata"].get("labels") or {}
    return labels.get(SCHEDULER_ROLE, "")


async def test_the_pod_is_labelled_leader_then_follower_as_the_lease_moves(
    emulator: KubeApiEmulator, settings: ExtenderSettings
) -> None:
    assert LEASES is not None
    ensure_namespace(emulator, NAMESPACE)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": NAMESPACE}, "spec": {}}
    pod["spec"] = {"containers": [{"name": "extender", "image": "hami-py"}]}
    emulator.store.create(PODS, NAMESPACE, pod)
    emulator.store.create(LEASES, NAMESPACE, _lease(f"{POD}_4f1c"))
    follower = dataclasses.replace(
        settings,
        identity=POD,
        leader_elect=True,
        leader_follow=True,
        lease_namespace=NAMESPACE,
        lease_duration=1,
        role_label=True,
    )
    async with serve(follower):
        await eventually(lambda: _role(emulator) == SCHEDULER_ROLE_LEADER, timeout=10, what="the leader label")

        def handed_over(lease: dict[str, Any]) -> dict[str, Any]:
            lease["spec"]["holderIdentity"] = "hami-scheduler-other_9e2b"
            return lease

        emulator.store.update(LEASES, NAMESPACE, "hami-scheduler", handed_over)
        await eventually(lambda: _role(emulator) == SCHEDULER_ROLE_FOLLOWER, timeout=10, what="the follower label")
