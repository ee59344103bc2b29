"""The emulator's API semantics, exercised with the official Python client, unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hami_sim.kubeapi import KubeApiEmulator
from tests.kube.conftest import node_body, pod_body

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def status_of(err: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(err.body or "{}")
    return body


def test_every_write_gets_a_new_resource_version(core: Any) -> None:
    created = core.create_namespaced_pod("default", pod_body("p"))
    patched = core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    assert int(patched.metadata.resource_version) > int(created.metadata.resource_version)
    assert created.metadata.uid
    assert created.status.phase == "Pending"


def test_update_with_stale_resource_version_is_409_conflict_status(core: Any) -> None:
    pod = core.create_namespaced_pod("default", pod_body("p"))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    pod.metadata.labels = {"stale": "yes"}
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_pod("p", "default", pod)
    status = status_of(err.value)
    assert err.value.status == 409
    assert status["kind"] == "Status"
    assert status["reason"] == "Conflict"
    assert status["code"] == 409


def test_merge_patch_with_stale_resource_version_is_409(core: Any) -> None:
    node = core.create_node(node_body("n1"))
    core.patch_node("n1", {"metadata": {"annotations": {"x": "1"}}}, _content_type=MERGE)
    stale = {"metadata": {"annotations": {"y": "2"}, "resourceVersion": node.metadata.resource_version}}
    with pytest.raises(ApiException) as err:
        core.patch_node("n1", stale, _content_type=MERGE)
    assert err.value.status == 409
    assert "y" not in (core.read_node("n1").metadata.annotations or {})


def test_merge_patch_null_removes_an_annotation(core: Any) -> None:
    core.create_node(node_body("n1"))
    core.patch_node("n1", {"metadata": {"annotations": {"a": "1", "b": "2"}}}, _content_type=MERGE)
    core.patch_node("n1", {"metadata": {"annotations": {"a": None}}}, _content_type=MERGE)
    assert core.read_node("n1").metadata.annotations == {"b": "2"}


def test_json_patch_applies_operations_in_order(core: Any) -> None:
    core.create_node(node_body("n1", labels={"a": "1"}))
    ops = [
        {"op": "add", "path": "/metadata/labels/b", "value": "2"},
        {"op": "remove", "path": "/metadata/labels/a"},
        {"op": "test", "path": "/metadata/labels/b", "value": "2"},
    ]
    assert core.patch_node("n1", ops, _content_type=JSON_PATCH).metadata.labels == {"b": "2"}


def test_failing_json_patch_test_operation_leaves_object_unchanged(core: Any) -> None:
    core.create_node(node_body("n1", labels={"a": "1"}))
    ops = [{"op": "replace", "path": "/metadata/labels/a", "value": "9"}, {"op": "test", "path": "/x", "value": 1}]
    with pytest.raises(ApiException) as err:
        core.patch_node("n1", ops, _content_type=JSON_PATCH)
    assert err.value.status == 422
    assert core.read_node("n1").metadata.labels == {"a": "1"}


def test_strategic_merge_patch_merges_containers_by_name(core: Any) -> None:
    body = pod_body("p")
    body["spec"]["containers"].append({"name": "side", "image": "old"})
    core.create_namespaced_pod("default", body)
    patch = {"spec": {"containers": [{"name": "side", "image": "new"}]}}
    pod = core.patch_namespaced_pod("p", "default", patch, _content_type=STRATEGIC)
    assert [(c.name, c.image) for c in pod.spec.containers] == [("main", "busybox"), ("side", "new")]


def test_status_subresource_changes_status_and_metadata_but_not_spec(core: Any) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    patch = {"status": {"phase": "Running"}, "metadata": {"labels": {"kept": "yes"}}, "spec": {"nodeName": "n"}}
    pod = core.patch_namespaced_pod_status("p", "default", patch)
    assert pod.status.phase == "Running"
    assert pod.metadata.labels == {"kept": "yes"}  # kube-apiserver keeps metadata written through /status
    assert pod.spec.node_name is None
    main = core.patch_namespaced_pod("p", "default", {"status": {"phase": "Failed"}})
    assert main.status.phase == "Running"


def test_node_status_subresource_sets_capacity(core: Any) -> None:
    core.create_node(node_body("n1"))
    node = core.patch_node_status("n1", {"status": {"capacity": {"nvidia.com/gpu": "4"}}})
    assert node.status.capacity == {"nvidia.com/gpu": "4"}


def test_label_selector_filters_lists(core: Any) -> None:
    core.create_namespaced_pod("default", pod_body("a", labels={"app": "x", "tier": "gpu"}))
    core.create_namespaced_pod("default", pod_body("b", labels={"app": "y"}))
    core.create_namespaced_pod("default", pod_body("c"))

    def names(selector: str) -> list[str]:
        return [p.metadata.name for p in core.list_namespaced_pod("default", label_selector=selector).items]

    assert names("app=x") == ["a"]
    assert names("app in (x,y)") == ["a", "b"]
    assert names("!app") == ["c"]
    assert names("app,tier!=gpu") == ["b"]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        pytest.param("spec.nodeName=n1", ["bound"], id="spec.nodeName selects pods bound to a node"),
        pytest.param("spec.nodeName=", ["pending"], id="an empty spec.nodeName selects unbound pods"),
        pytest.param("metadata.name=pending", ["pending"], id="metadata.name selects by name"),
        pytest.param("status.phase!=Pending", [], id="status.phase compares the phase"),
        pytest.param("metadata.namespace=other", [], id="metadata.namespace selects by namespace"),
    ],
)
def test_field_selectors_on_pods(core: Any, selector: str, expected: list[str]) -> None:
    core.create_namespaced_pod("default", pod_body("bound"))
    core.create_namespaced_pod("default", pod_body("pending"))
    binding = client.V1Binding(metadata=client.V1ObjectMeta(name="bound"), target=client.V1ObjectReference(name="n1"))
    with pytest.raises(ValueError, match="target"):  # the client's known decoding failure after a good bind
        core.create_namespaced_pod_binding("bound", "default", binding)
    found = core.list_pod_for_all_namespaces(field_selector=selector).items
    assert [p.metadata.name for p in found] == expected


def test_unsupported_field_selector_is_400(core: Any) -> None:
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod("default", field_selector="spec.bogus=1")
    assert err.value.status == 400
    assert status_of(err.value)["reason"] == "BadRequest"


def test_missing_object_is_404_not_found_status(core: Any) -> None:
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod("ghost", "default")
    status = status_of(err.value)
    assert (err.value.status, status["reason"], status["details"]["name"]) == (404, "NotFound", "ghost")


def test_creating_an_existing_object_is_409_already_exists(core: Any) -> None:
    core.create_node(node_body("n1"))
    with pytest.raises(ApiException) as err:
        core.create_node(node_body("n1"))
    assert err.value.status == 409
    assert status_of(err.value)["reason"] == "AlreadyExists"


def test_invalid_object_is_422_with_causes(core: Any) -> None:
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", {"metadata": {"name": "Bad_Name"}, "spec": {"containers": []}})
    status = status_of(err.value)
    assert err.value.status == 422
    assert status["reason"] == "Invalid"
    assert {c["field"] for c in status["details"]["causes"]} == {"metadata.name", "spec.containers"}


def test_pod_in_missing_namespace_is_404(core: Any) -> None:
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("nowhere", pod_body("p", namespace="nowhere"))
    assert err.value.status == 404


def test_update_may_not_move_a_pod_to_another_node(core: Any) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod("p", "default", {"spec": {"nodeName": "n1"}})
    assert err.value.status == 422
    assert core.read_namespaced_pod("p", "default").spec.node_name is None


def test_binding_answers_201_status_and_sets_node_annotations_and_condition(api_client: Any, core: Any) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    body = {"metadata": {"name": "p", "annotations": {"example.com/a": "1"}}, "target": {"kind": "Node", "name": "n1"}}
    resp = core.create_namespaced_pod_binding("p", "default", body, _preload_content=False)
    assert resp.status == 201
    assert json.loads(resp.data) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    pod = core.read_namespaced_pod("p", "default")
    assert pod.spec.node_name == "n1"
    assert pod.metadata.annotations == {"example.com/a": "1"}
    assert [(c.type, c.status) for c in pod.status.conditions] == [("PodScheduled", "True")]


def test_binding_an_already_bound_pod_is_409_and_pod_stays(core: Any) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    core.create_namespaced_pod_binding(
        "p", "default", {"metadata": {"name": "p"}, "target": {"name": "n1"}}, _preload_content=False
    )
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_binding(
            "p", "default", {"metadata": {"name": "p"}, "target": {"name": "n2"}}, _preload_content=False
        )
    assert err.value.status == 409
    assert "already assigned" in status_of(err.value)["message"]
    assert core.read_namespaced_pod("p", "default").spec.node_name == "n1"


def test_binding_with_wrong_uid_is_409(core: Any) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    body = {"metadata": {"name": "p", "uid": "not-the-uid"}, "target": {"name": "n1"}}
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_binding("p", "default", body, _preload_content=False)
    assert err.value.status == 409


def test_binding_name_mismatch_is_400(core: Any) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_binding(
            "p", "default", {"metadata": {"name": "q"}, "target": {"name": "n1"}}, _preload_content=False
        )
    assert err.value.status == 400


def test_delete_with_stale_precondition_is_409_and_object_stays(core: Any) -> None:
    node = core.create_node(node_body("n1"))
    core.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    options = client.V1DeleteOptions(
        preconditions=client.V1Preconditions(resource_version=node.metadata.resource_version)
    )
    with pytest.raises(ApiException) as err:
        core.delete_node("n1", body=options)
    assert err.value.status == 409
    core.delete_node("n1")
    assert core.list_node().items == []


def test_namespaces_resourcequotas_events_and_leases_round_trip(api_client: Any, core: Any) -> None:
    core.create_namespace({"metadata": {"name": "team"}})
    quota = {"metadata": {"name": "q"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "4096"}}}
    core.create_namespaced_resource_quota("team", quota)
    assert core.read_namespaced_resource_quota("q", "team").spec.hard == {"limits.nvidia.com/gpumem": "4096"}
    event = {
        "metadata": {"name": "e1"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "team"},
        "reason": "Tested",
        "message": "hello",
        "type": "Normal",
    }
    core.create_namespaced_event("team", event)
    found = core.list_namespaced_event("team", field_selector="involvedObject.name=p").items
    assert [e.reason for e in found] == ["Tested"]
    leases: Any = client.CoordinationV1Api(api_client)
    leases.create_namespaced_lease("team", {"metadata": {"name": "l"}, "spec": {"holderIdentity": "me"}})
    assert leases.read_namespaced_lease("l", "team").spec.holder_identity == "me"
    core.delete_namespace("team")
    assert core.list_resource_quota_for_all_namespaces().items == []


def test_state_survives_a_restart_on_the_same_port(emulator: KubeApiEmulator, core: Any) -> None:
    port = emulator.port
    created = core.create_node(node_body("n1"))
    emulator.restart()
    assert emulator.port == port
    assert core.read_node("n1").metadata.resource_version == created.metadata.resource_version


def test_list_with_limit_pages_with_continue_tokens(core: Any) -> None:
    for name in ("a", "b", "c"):
        core.create_node(node_body(name))
    first = core.list_node(limit=2)
    assert [n.metadata.name for n in first.items] == ["a", "b"]
    assert first.metadata.remaining_item_count == 1
    rest = core.list_node(limit=2, _continue=first.metadata._continue)
    assert [n.metadata.name for n in rest.items] == ["c"]
    assert not rest.metadata._continue
