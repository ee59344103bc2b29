"""``hami status --kubeconfig`` against a real kube-apiserver: the GPU overview a HAMi user gets of any
cluster (nodes, GPUs, what is booked and by which pods, why a pending pod waits), read through the admin
kubeconfig over TLS as an operator's own would be, and the same for scripts with ``-o json``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from hami_sim.realk8s import K8sBinaries
from hami_sim.stack import LocalCluster
from hami_sim.stack.audit import gpu_pod
from hami_sim.waiting import eventually
from tests.realk8s.conftest import real_config

HAMI = str(Path(sys.executable).parent / "hami")


def hami_status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HAMI, "status", *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.timeout(300)
async def test_status_of_a_real_cluster_shows_gpus_placements_and_why_a_pod_waits(
    k8s: K8sBinaries, tmp_path: Path, sockdir: Path
) -> None:
    async with LocalCluster(real_config(tmp_path, sockdir, nodes=2)) as cluster:
        placed = await cluster.submit(gpu_pod("placed", mem=3000, cores=30))
        async with asyncio.timeout(120):
            admitted = (await cluster.wait_admitted([placed["metadata"]["uid"]]))[placed["metadata"]["uid"]]
        waiting = await cluster.submit(gpu_pod("too-big", mem=200_000))  # no card has 200 GB
        uid = waiting["metadata"]["uid"]

        async def failed_scheduling() -> bool:
            events = await cluster.kube.list_events("default", field_selector="reason=FailedScheduling")
            return any(e.involved_object.uid == uid for e in events)

        await eventually(failed_scheduling, timeout=90, what="FailedScheduling from kube-scheduler")
        # the web page's reason for the waiting pod: the extender's refusal, through the deployed NATS (its
        # nats.conf must let the extender publish and the metrics service subscribe), behind the bearer token
        workloads = cluster.metrics_url.removesuffix("/metrics") + "/ui/api/workloads"
        bearer = {"Authorization": f"Bearer {cluster.metrics_token}"}
        async with httpx.AsyncClient(timeout=10) as client:
            assert (await client.get(workloads)).status_code == 401

            async def refused() -> str | None:
                rows = (await client.get(workloads, headers=bearer)).json()
                reason = next((r["reason"] for r in rows if r["name"] == "too-big"), "")
                return reason if "no node fits" in reason else None

            page_reason = await eventually(refused, timeout=60, what="the filter's refusal on the web page")
        kubeconfig = str(cluster.config.kubeconfig)
        token = tmp_path / "metrics-token"  # deploy/'s metrics service serves /metrics to its bearer only
        token.write_text(cluster.metrics_token)
        metrics = ("--metrics", cluster.metrics_url, "--metrics-token-file", str(token))
        as_json = await asyncio.to_thread(hami_status, "--kubeconfig", kubeconfig, *metrics, "-o", "json")
        as_table = await asyncio.to_thread(hami_status, "--kubeconfig", kubeconfig)
        nodes = set(cluster.config.node_names())

    assert as_json.returncode == 0, as_json.stderr
    view = json.loads(as_json.stdout)
    assert view["cluster"].startswith("https://")  # the real apiserver, over TLS
    assert {g["node"] for g in view["gpus"]} == nodes
    assert len(view["gpus"]) == len(nodes) * 8
    holding = [g for g in view["gpus"] if "default/placed" in g["pods"]]
    assert len(holding) == 1
    (gpu,) = holding
    assert (gpu["node"], gpu["memory_booked_mib"], gpu["cores_booked"], gpu["slices_booked"]) == (
        admitted.node,
        3000,
        30,
        1,
    )
    assert view["metrics"] == "ok"
    pods = {p["pod"]: p for p in view["pods"]}
    assert pods["default/placed"]["node"] == admitted.node
    assert pods["default/placed"]["devices"]
    assert gpu["uuid"] in pods["default/placed"]["devices"][0]
    assert pods["default/too-big"]["state"] == "Pending"
    assert pods["default/too-big"]["node"] == ""
    assert "CardInsufficientMemory" in pods["default/too-big"]["reason"]
    assert "CardInsufficientMemory" in page_reason  # the page and hami status give the same reason

    assert as_table.returncode == 0, as_table.stderr
    assert "CardInsufficientMemory" in as_table.stdout
    assert admitted.node in as_table.stdout
