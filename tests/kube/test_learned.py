"""What the emulator learned from the real kube-apiserver (tests/realk8s/test_emulator_agrees.py found each
of these differences); kept here so it is tested where the real binaries are absent."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from hami_sim.kubeapi import KubeApiEmulator
from tests.kube.conftest import node_body, pod_body

MERGE = "application/merge-patch+json"


def status_of(err: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(err.body or "{}")
    return body


def raw(emulator: KubeApiEmulator, method: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(method, emulator.url + path, json=body)


def test_every_namespace_carries_its_name_as_a_label(core: Any) -> None:
    core.create_namespace({"metadata": {"name": "team-a", "labels": {"x": "y"}}})
    assert core.read_namespace("team-a").metadata.labels == {"x": "y", "kubernetes.io/metadata.name": "team-a"}
    patched = core.patch_namespace("team-a", {"metadata": {"labels": {"kubernetes.io/metadata.name": None}}})
    assert patched.metadata.labels["kubernetes.io/metadata.name"] == "team-a"
    assert core.read_namespace("default").metadata.labels == {"kubernetes.io/metadata.name": "default"}


def test_list_items_carry_no_kind_and_empty_label_maps_are_dropped(emulator: KubeApiEmulator, core: Any) -> None:
    core.create_namespaced_pod("default", pod_body("p"))  # labels: {}
    items = raw(emulator, "GET", "/api/v1/namespaces/default/pods").json()["items"]
    assert "kind" not in items[0]
    assert "apiVersion" not in items[0]
    assert "labels" not in items[0]["metadata"]
    single = raw(emulator, "GET", "/api/v1/namespaces/default/pods/p").json()
    assert (single["kind"], single["apiVersion"]) == ("Pod", "v1")


def test_a_put_without_resource_version_is_unconditional(core: Any) -> None:
    pod = core.create_namespaced_pod("default", pod_body("p"))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    pod.metadata.resource_version = None
    pod.metadata.labels = {"c": "d"}
    assert core.replace_namespaced_pod("p", "default", pod).metadata.labels == {"c": "d"}


def test_limits_are_the_default_requests(core: Any) -> None:
    pod = pod_body("p")
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "2", "cpu": "1"},
        "requests": {"cpu": "500m"},
    }
    created = core.create_namespaced_pod("default", pod)
    assert created.spec.containers[0].resources.requests == {"nvidia.com/gpu": "2", "cpu": "500m"}


def test_deleting_a_pod_marks_it_before_it_goes(core: Any) -> None:
    start = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod_body("unbound"))
    answer = core.delete_namespaced_pod("unbound", "default", _preload_content=False).json()
    assert answer["kind"] == "Pod"
    assert answer["metadata"]["deletionGracePeriodSeconds"] == 0  # a pod on no node goes at once
    core.create_namespaced_pod("default", pod_body("bound"))
    core.create_namespaced_binding(
        "default", {"metadata": {"name": "bound"}, "target": {"name": "n1"}}, _preload_content=False
    )
    answer = core.delete_namespaced_pod("bound", "default", _preload_content=False).json()
    assert answer["metadata"]["deletionGracePeriodSeconds"] == 30  # the pod's terminationGracePeriodSeconds
    stream: Any = watch.Watch()  # type: ignore[no-untyped-call]
    seen = []
    for event in stream.stream(core.list_namespaced_pod, "default", resource_version=start, timeout_seconds=5):
        meta = event["raw_object"]["metadata"]
        seen.append((event["type"], meta["name"], "deletionTimestamp" in meta))
        if len(seen) == 7:
            stream.stop()
    assert seen == [
        ("ADDED", "unbound", False),
        ("MODIFIED", "unbound", True),
        ("DELETED", "unbound", True),
        ("ADDED", "bound", False),
        ("MODIFIED", "bound", False),  # the binding
        ("MODIFIED", "bound", True),
        ("DELETED", "bound", True),
    ]


def test_other_deletes_answer_a_success_status(emulator: KubeApiEmulator, core: Any) -> None:
    created = core.create_node(node_body("n1"))
    answer = raw(emulator, "DELETE", "/api/v1/nodes/n1").json()
    assert answer == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "n1", "kind": "nodes", "uid": created.metadata.uid},
    }


def test_conflicts_name_what_kube_apiserver_names(core: Any) -> None:
    created = core.create_namespaced_pod("default", pod_body("p"))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    stale = created.metadata.resource_version
    with pytest.raises(ApiException) as err:
        core.delete_namespaced_pod("p", "default", body={"preconditions": {"resourceVersion": stale}})
    status = status_of(err.value)
    assert status["details"] == {"name": "p", "kind": "Pod"}
    assert status["message"].startswith(
        f'Operation cannot be fulfilled on Pod "p": the ResourceVersion in the precondition ({stale})'
    )
    binding = {"metadata": {"name": "p"}, "target": {"name": "n1"}}
    core.create_namespaced_binding("default", binding, _preload_content=False)
    with pytest.raises(ApiException) as err:
        core.create_namespaced_binding("default", binding, _preload_content=False)
    status = status_of(err.value)
    assert status["details"] == {"name": "p", "kind": "pods/binding"}
    why = 'pod p is already assigned to node "n1"'
    assert status["message"] == f'Operation cannot be fulfilled on pods/binding "p": {why}'


def test_timestamps_are_stored_as_go_writes_them(emulator: KubeApiEmulator, core: Any, api_client: Any) -> None:
    event = {
        "metadata": {"name": "e"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
        "firstTimestamp": "2026-01-01T01:00:00.5+01:00",
    }
    stored = raw(emulator, "POST", "/api/v1/namespaces/default/events", event).json()
    assert stored["firstTimestamp"] == "2026-01-01T00:00:00Z"
    leases: Any = client.CoordinationV1Api(api_client)
    lease = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a", "renewTime": "2026-01-01T00:00:00+00:00"}}
    answer = raw(emulator, "POST", "/apis/coordination.k8s.io/v1/namespaces/default/leases", lease)
    assert answer.status_code == 400  # a MicroTime needs its six fractional digits
    assert "parsing time" in answer.json()["message"]
    lease["spec"]["renewTime"] = "2026-01-01T02:00:00.123456+02:00"
    assert leases.create_namespaced_lease("default", lease, _preload_content=False).json()["spec"]["renewTime"] == (
        "2026-01-01T00:00:00.123456Z"
    )


def test_events_must_agree_with_their_objects_namespace(core: Any) -> None:
    core.create_namespace({"metadata": {"name": "team-a"}})
    other = {"metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": "team-b"}}
    with pytest.raises(ApiException) as err:
        core.create_namespaced_event("team-a", other)
    status = status_of(err.value)
    assert (err.value.status, status["details"]["causes"][0]["field"]) == (422, "involvedObject.namespace")
    node_event = {"metadata": {"name": "n"}, "involvedObject": {"kind": "Node", "name": "n1"}}
    core.create_namespaced_event("default", node_event)
    with pytest.raises(ApiException):
        core.create_namespaced_event("team-a", node_event)


def test_field_selectors_are_kube_apiservers(core: Any) -> None:
    for name, component in (("a", "hami-scheduler"), ("b", "")):
        event = {
            "metadata": {"name": name},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
            "source": {"component": component},
            "reportingComponent": "hami-extender",
        }
        core.create_namespaced_event("default", event)
    by_source = core.list_namespaced_event("default", field_selector="source=hami-scheduler")
    assert [e.metadata.name for e in by_source.items] == ["a"]
    falls_back = core.list_namespaced_event("default", field_selector="source=hami-extender")
    assert [e.metadata.name for e in falls_back.items] == ["b"]  # no source component: the reporting one
    with pytest.raises(ApiException) as err:
        core.list_namespaced_event("default", field_selector="source.component=x")
    assert (err.value.status, status_of(err.value)["message"]) == (400, "field label not supported: source.component")
    with pytest.raises(ApiException) as err:
        core.list_node(field_selector="metadata.namespace=default")  # nodes have no namespace
    assert (err.value.status, status_of(err.value)["message"]) == (400, "field label not supported: metadata.namespace")


def test_validation_messages_and_cause_reasons_are_kube_apiservers(core: Any) -> None:
    empty = pod_body("p")
    empty["spec"]["containers"] = []
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", empty)
    assert status_of(err.value)["details"]["causes"] == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.containers"}
    ]
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", pod_body("Bad_Name"))
    assert (
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters"
        in (status_of(err.value)["message"])
    )
