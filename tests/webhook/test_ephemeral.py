"""Ephemeral containers added to a GPU pod (``pods/ephemeralcontainers`` UPDATE) meet the same privilege
rule as the pod's own containers (issue 16 item 10): a privileged or CAP_SYS_ADMIN debugger would reach the
GPUs and the interposer's files without the limits the GPU containers run under."""

from __future__ import annotations

from typing import Any

import pytest

from hami_common.resources import GPU
from tests.webhook.support import ServedWebhook, container, pod, review

Json = dict[str, Any]


def debugger(*, privileged: bool | None = None, add: list[str] | None = None) -> Json:
    ctr = container("debugger", privileged=privileged)
    if add is not None:
        ctr.setdefault("securityContext", {})["capabilities"] = {"add": add}
    return ctr


def with_debugger(old: Json, ctr: Json) -> Json:
    return {**old, "spec": {**old["spec"], "ephemeralContainers": [*old["spec"].get("ephemeralContainers", []), ctr]}}


def ephemeral_update(old: Json, new: Json) -> Json:
    sent = review(new, operation="UPDATE", old=old)
    sent["request"]["subResource"] = "ephemeralcontainers"
    return sent


GPU_POD = pod(container(limits={GPU: "1"}), scheduler="hami-scheduler")
CPU_POD = pod(container(limits={"cpu": "1"}), scheduler="default-scheduler")


@pytest.mark.parametrize(
    ("ctr", "message"),
    [
        pytest.param(debugger(privileged=True), "ephemeral container debugger is privileged", id="privileged"),
        pytest.param(debugger(add=["SYS_ADMIN"]), "ephemeral container debugger adds CAP_SYS_ADMIN", id="SYS_ADMIN"),
        pytest.param(debugger(add=["cap_sys_admin"]), "ephemeral container debugger adds CAP_SYS_ADMIN", id="cap_"),
        pytest.param(
            debugger(add=["NET_ADMIN", "all"]),
            "ephemeral container debugger adds CAP_SYS_ADMIN (capabilities.add 'all' is every capability)",
            id="all",
        ),
    ],
)
def test_an_escalating_ephemeral_container_added_to_a_gpu_pod_is_denied(
    webhook: ServedWebhook, ctr: Json, message: str
) -> None:
    response = webhook.admit(ephemeral_update(GPU_POD, with_debugger(GPU_POD, ctr)))
    assert response["allowed"] is False
    assert response["status"] == {"code": 403, "reason": "Forbidden", "message": message}


@pytest.mark.parametrize(
    ("old", "ctr"),
    [
        pytest.param(GPU_POD, debugger(), id="a plain debugger on a GPU pod"),
        pytest.param(GPU_POD, debugger(add=["NET_ADMIN"]), id="another capability on a GPU pod"),
        pytest.param(CPU_POD, debugger(privileged=True), id="a privileged debugger on a CPU pod"),
    ],
)
def test_other_ephemeral_containers_are_allowed(webhook: ServedWebhook, old: Json, ctr: Json) -> None:
    assert webhook.admit(ephemeral_update(old, with_debugger(old, ctr)))["allowed"] is True


def test_an_update_of_a_pod_that_already_had_the_debugger_is_allowed(webhook: ServedWebhook) -> None:
    """Only a newly added container is judged, so later patches of an older pod are not blocked by it."""
    old = with_debugger(GPU_POD, debugger(privileged=True))
    new = {**old, "metadata": {**old["metadata"], "labels": {"app": "cuda", "debugged": "yes"}}}
    assert webhook.admit(review(new, operation="UPDATE", old=old))["allowed"] is True


def test_a_gpu_pod_whose_container_adds_cap_sys_admin_is_denied(webhook: ServedWebhook) -> None:
    ctr = container(limits={GPU: "1"})
    ctr["securityContext"] = {"capabilities": {"add": ["SYS_ADMIN"]}}
    response = webhook.admit(review(pod(ctr)))
    assert response["allowed"] is False
    assert response["status"]["message"] == "container main adds CAP_SYS_ADMIN"


@pytest.mark.parametrize("written", ["ALL", "all", "All", "CAP_ALL"])
def test_a_gpu_pod_whose_container_adds_all_capabilities_is_denied(webhook: ServedWebhook, written: str) -> None:
    """``ALL`` (any case: the runtimes compare it so) is every capability, CAP_SYS_ADMIN among them (issue 28
    item 3): it was allowed, though it lets the container remount the interposer's preload away."""
    ctr = container(limits={GPU: "1"})
    ctr["securityContext"] = {"capabilities": {"add": [written]}}
    response = webhook.admit(review(pod(ctr)))
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        f"container main adds CAP_SYS_ADMIN (capabilities.add {written!r} is every capability)"
    )


def test_a_cpu_pod_may_add_all_capabilities(webhook: ServedWebhook) -> None:
    """The rule guards GPU pods only: a CPU pod's capabilities are the cluster's PodSecurity business."""
    ctr = container(limits={"cpu": "1"})
    ctr["securityContext"] = {"capabilities": {"add": ["ALL"]}}
    assert webhook.admit(review(pod(ctr, scheduler=None)))["allowed"] is True
