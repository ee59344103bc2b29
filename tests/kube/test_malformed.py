"""Malformed input: the emulator answers a proper Status and keeps serving; our decoders raise
InvalidInput, never anything else; upstream full-field fixtures decode."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_common.errors import InvalidInput
from hami_common.kube import KubeClient, Node, Pod, decode_watch_line
from hami_sim.kubeapi import KubeApiEmulator
from tests.kube.conftest import node_body, pod_body

CONTENT_TYPES = [
    "application/json",
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/strategic-merge-patch+json",
    "text/plain",
]
PATHS = [
    ("POST", "/api/v1/namespaces/default/pods"),
    ("PUT", "/api/v1/nodes/n1"),
    ("PATCH", "/api/v1/nodes/n1"),
    ("PATCH", "/api/v1/nodes/n1/status"),
    ("POST", "/api/v1/namespaces/default/pods/p/binding"),
    ("DELETE", "/api/v1/nodes/ghost"),
    ("POST", "/apis/coordination.k8s.io/v1/namespaces/default/leases"),
    ("GET", "/api/v1/pods?labelSelector=%28%28&fieldSelector=x"),
    ("GET", "/api/v1/namespaces/default/pods?watch=1&resourceVersion=abc"),
    ("GET", "/api/v2/bogus/path"),
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
objects = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.dictionaries(
            st.sampled_from(["name", "labels", "annotations", "resourceVersion", "uid", "namespace"]),
            json_values,
            max_size=3,
        ),
        "spec": json_values,
        "status": json_values,
        "target": json_values,
        "kind": json_values,
    },
)
bodies = st.one_of(
    st.binary(max_size=64),
    objects.map(lambda o: json.dumps(o).encode()),
    st.lists(json_values, max_size=3).map(lambda o: json.dumps(o).encode()),
)


@pytest.fixture
def http(emulator: KubeApiEmulator, core: Any) -> Any:
    core.create_node(node_body("n1"))
    with httpx.Client(base_url=emulator.url, timeout=5) as connected:
        yield connected


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.sampled_from(PATHS), content_type=st.sampled_from(CONTENT_TYPES), body=bodies)
def test_emulator_answers_garbage_with_a_status_and_keeps_serving(
    http: httpx.Client, target: tuple[str, str], content_type: str, body: bytes
) -> None:
    method, path = target
    resp = http.request(method, path, content=body, headers={"Content-Type": content_type})
    if resp.status_code >= 400:
        status = resp.json()
        assert status["kind"] == "Status"
        assert status["code"] == resp.status_code
        assert resp.status_code != 500 or "binding" in path, status
    assert http.get("/api/v1/nodes/n1").status_code == 200


@settings(max_examples=200, deadline=None)
@given(
    line=st.one_of(
        st.binary(max_size=80), json_values.map(lambda v: json.dumps({"type": "ADDED", "object": v}).encode())
    )
)
def test_watch_line_decoder_raises_only_invalid_input(line: bytes) -> None:
    try:
        item = decode_watch_line(line, Pod)
    except InvalidInput:
        return
    assert item.type in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR")


@settings(max_examples=200, deadline=None)
@given(body=st.one_of(st.binary(max_size=80), json_values.map(lambda v: json.dumps({"metadata": v}).encode())))
def test_object_decoder_raises_only_invalid_input(body: bytes) -> None:
    with contextlib.suppress(InvalidInput):
        KubeClient.decode("pod x", body, Pod)


@pytest.mark.parametrize("name", ["core.v1.Pod.json", "core.v1.Pod.v1.36.0.json"])
def test_upstream_full_field_pod_decodes_ignoring_unknown_fields(shared_fixtures: Path, name: str) -> None:
    raw = (shared_fixtures / "k8s" / name).read_bytes()
    pod = msgspec.json.decode(raw, type=Pod)
    source = json.loads(raw)
    assert pod.metadata.name == source["metadata"]["name"]
    assert pod.metadata.annotations == source["metadata"]["annotations"]
    assert pod.spec.node_name == source["spec"]["nodeName"]
    assert pod.spec.containers[0].resources.limits == source["spec"]["containers"][0]["resources"]["limits"]
    assert pod.status.phase == source["status"]["phase"]


@pytest.mark.parametrize("name", ["core.v1.Node.json", "core.v1.Node.v1.36.0.json"])
def test_upstream_full_field_node_decodes(shared_fixtures: Path, name: str) -> None:
    raw = (shared_fixtures / "k8s" / name).read_bytes()
    node = msgspec.json.decode(raw, type=Node)
    source = json.loads(raw)
    assert node.status.capacity == source["status"]["capacity"]
    assert node.spec.unschedulable == source["spec"]["unschedulable"]


def test_emulator_stores_the_upstream_full_field_pod(
    shared_fixtures: Path, core: Any, emulator: KubeApiEmulator
) -> None:
    fixture = json.loads((shared_fixtures / "k8s" / "core.v1.Pod.json").read_text())
    fixture["metadata"] = {"name": "full", "labels": {"app": "full"}}
    fixture["spec"].pop("nodeName")
    for container in fixture["spec"]["containers"] + fixture["spec"]["initContainers"]:
        container["name"] = container["name"].lower()
    with httpx.Client(base_url=emulator.url) as http:
        resp = http.post("/api/v1/namespaces/default/pods", json=fixture)
    assert resp.status_code == 201, resp.text
    stored = msgspec.json.decode(resp.content, type=Pod)
    assert stored.metadata.uid
    assert stored.spec.containers[0].image == fixture["spec"]["containers"][0]["image"]


def test_upstream_binding_fixture_is_refused_for_its_bogus_target(
    shared_fixtures: Path, emulator: KubeApiEmulator, core: Any
) -> None:
    core.create_namespaced_pod("default", pod_body("namevalue"))
    binding = json.loads((shared_fixtures / "k8s" / "core.v1.Binding.json").read_text())
    binding["metadata"]["name"] = "namevalue"
    with httpx.Client(base_url=emulator.url) as http:
        resp = http.post("/api/v1/namespaces/default/pods/namevalue/binding", json=binding)
    assert resp.json()["kind"] == "Status"
    assert resp.status_code >= 400
    assert core.read_namespaced_pod("namevalue", "default").spec.node_name is None
