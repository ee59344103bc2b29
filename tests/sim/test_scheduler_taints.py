"""The kube-scheduler stand-in honours node taints as kube-scheduler's TaintToleration filter does: a node with
a ``NoSchedule`` or ``NoExecute`` taint is offered to the extender only for pods that tolerate it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from hami_common.kube import KubeClient, Node, Pod
from hami_sim.scheduler import SchedulerDriver, untolerated_taint
from hami_sim.stack import MIG_TAINT
from hami_sim.waiting import eventually
from tests.sim.test_scheduler_driver import OURS, ToyExtender, node_of, serve
from tests.sim.test_scheduler_managed import failures_of

GPU = "nvidia.com/gpu"
MIG = {"key": GPU, "operator": "Equal", "value": "mig", "effect": "NoSchedule"}  # examples/mig.yaml's


def node(*taints: dict[str, str]) -> Node:
    return msgspec.convert({"metadata": {"name": "n"}, "spec": {"taints": list(taints)}}, Node)


def pod(*tolerations: dict[str, str]) -> Pod:
    return msgspec.convert({"metadata": {"name": "p"}, "spec": {"tolerations": list(tolerations)}}, Pod)


UNTOLERATED = f"node(s) had untolerated taint {{{GPU}: mig}}"  # kube-scheduler's words


@pytest.mark.parametrize(
    ("taints", "tolerations", "reason"),
    [
        pytest.param([], [], "", id="an untainted node takes any pod"),
        pytest.param([MIG_TAINT], [], UNTOLERATED, id="a tainted node refuses a pod without tolerations"),
        pytest.param([MIG_TAINT], [MIG], "", id="the matching key, value and effect tolerate it"),
        pytest.param([MIG_TAINT], [{"key": GPU, "operator": "Exists"}], "", id="Exists ignores value and effect"),
        pytest.param([MIG_TAINT], [{"operator": "Exists"}], "", id="Exists without a key tolerates every taint"),
        pytest.param([MIG_TAINT], [{**MIG, "value": "shared"}], UNTOLERATED, id="another value does not"),
        pytest.param([MIG_TAINT], [{**MIG, "effect": "NoExecute"}], UNTOLERATED, id="another effect does not"),
        pytest.param([MIG_TAINT], [{"key": GPU, "value": "mig"}], "", id="the operator defaults to Equal"),
        pytest.param([{**MIG_TAINT, "effect": "PreferNoSchedule"}], [], "", id="PreferNoSchedule only scores"),
        pytest.param([{**MIG_TAINT, "effect": "NoExecute"}], [], UNTOLERATED, id="NoExecute repels too"),
    ],
)
def test_a_node_takes_a_pod_only_when_each_repelling_taint_is_tolerated(
    taints: list[dict[str, str]], tolerations: list[dict[str, str]], reason: str
) -> None:
    assert untolerated_taint(node(*taints), pod(*tolerations)) == reason


def make_node(core: Any, name: str, *taints: dict[str, str]) -> None:
    machine = {GPU: "10", "pods": "10"}
    core.create_node(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {"taints": list(taints)},
         "status": {"capacity": machine, "allocatable": machine}}
    )  # fmt: skip


def make_pod(core: Any, name: str, *tolerations: dict[str, str]) -> None:
    spec = {
        "schedulerName": OURS,
        "tolerations": list(tolerations),
        "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {GPU: "1"}}}],
    }
    core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


@pytest.fixture
async def extender(core: Any, kube: KubeClient) -> AsyncIterator[ToyExtender]:
    toy = ToyExtender(core)  # fits a pod on the first node it is offered
    url, server, thread = serve(toy.app)
    task = asyncio.create_task(SchedulerDriver(kube, url, retry_after=0.1).run())
    yield toy
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    server.should_exit = True
    await asyncio.to_thread(thread.join, 10)


async def test_only_a_pod_that_tolerates_the_taint_is_offered_the_tainted_node(
    core: Any, extender: ToyExtender
) -> None:
    make_node(core, "a-mig", MIG_TAINT)  # first by name: the toy extender takes it whenever it is offered
    make_node(core, "b-shared")
    make_pod(core, "plain")
    make_pod(core, "tolerant", MIG)
    await eventually(lambda: node_of(core, "plain") == "b-shared", timeout=10)
    await eventually(lambda: node_of(core, "tolerant") == "a-mig", timeout=10)


async def test_a_pod_that_tolerates_no_node_stays_pending_with_kube_schedulers_reason(
    core: Any, extender: ToyExtender
) -> None:
    make_node(core, "a-mig", MIG_TAINT)
    make_pod(core, "plain")
    await eventually(lambda: bool(failures_of(core, "plain")), timeout=10)
    assert failures_of(core, "plain")[0] == f"0/1 nodes are available: a-mig: {UNTOLERATED}."
    assert extender.filtered == []  # kube-scheduler's own filters left no node: the extender is not asked
    assert node_of(core, "plain") == ""
