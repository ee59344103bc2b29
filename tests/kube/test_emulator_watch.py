"""Watch semantics of the emulator, read with the official client's own Watch and raw streams."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes import watch

from hami_sim.kubeapi import ApiError, KubeApiEmulator, find_resource, parse_field_selector, parse_label_selector
from tests.kube.conftest import node_body, pod_body


def collect(core_list: Any, count: int, **kwargs: Any) -> list[tuple[str, str]]:
    """The first ``count`` events of a watch, as (type, name); stops the watch right after."""
    w: Any = watch.Watch()  # type: ignore[no-untyped-call]
    events: list[tuple[str, str]] = []
    for event in w.stream(core_list, timeout_seconds=20, **kwargs):
        obj = event["raw_object"]
        events.append((event["type"], obj["metadata"].get("name", "")))
        if len(events) == count:
            w.stop()
            break
    return events


def test_watch_replays_added_modified_deleted_after_a_resource_version(core: Any) -> None:
    start = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod_body("p"))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    core.delete_namespaced_pod("p", "default")
    events = collect(core.list_namespaced_pod, 4, namespace="default", resource_version=start)
    # the delete marks the pod (deletionTimestamp) before it removes it, as kube-apiserver does
    assert events == [("ADDED", "p"), ("MODIFIED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]


def test_watch_without_resource_version_starts_with_current_objects(core: Any) -> None:
    core.create_node(node_body("a"))
    core.create_node(node_body("b"))
    assert collect(core.list_node, 2) == [("ADDED", "a"), ("ADDED", "b")]


def test_watch_with_selector_sees_objects_leave_and_enter_it(core: Any) -> None:
    start = core.list_node().metadata.resource_version
    core.create_node(node_body("n", labels={"gpu": "true"}))
    core.patch_node("n", {"metadata": {"labels": {"gpu": "false"}}})
    core.patch_node("n", {"metadata": {"labels": {"gpu": "true"}}})
    events = collect(core.list_node, 3, label_selector="gpu=true", resource_version=start)
    assert events == [("ADDED", "n"), ("DELETED", "n"), ("ADDED", "n")]


def test_watch_field_selector_follows_spec_node_name(core: Any) -> None:
    start = core.list_pod_for_all_namespaces().metadata.resource_version
    core.create_namespaced_pod("default", pod_body("p"))
    core.create_namespaced_pod_binding(
        "p", "default", {"metadata": {"name": "p"}, "target": {"name": "n1"}}, _preload_content=False
    )
    events = collect(core.list_pod_for_all_namespaces, 1, field_selector="spec.nodeName=n1", resource_version=start)
    assert events == [("ADDED", "p")]


def test_watch_from_a_compacted_resource_version_gets_410_gone(core: Any, emulator: KubeApiEmulator) -> None:
    old = core.list_node().metadata.resource_version
    core.create_node(node_body("n"))
    emulator.compact()
    resp = core.list_node(watch=True, resource_version=old, _preload_content=False)
    first = json.loads(resp.readline())
    resp.release_conn()
    assert first["type"] == "ERROR"
    assert first["object"]["kind"] == "Status"
    assert first["object"]["code"] == 410
    assert first["object"]["reason"] == "Expired"


def test_watch_sends_bookmarks_when_asked(core: Any) -> None:
    version = core.list_node().metadata.resource_version
    w: Any = watch.Watch()  # type: ignore[no-untyped-call]
    for event in w.stream(core.list_node, resource_version=version, allow_watch_bookmarks=True, timeout_seconds=20):
        assert event["type"] == "BOOKMARK"
        assert event["raw_object"]["metadata"]["resourceVersion"] == version
        w.stop()
        break


def test_watch_ends_when_the_emulator_stops_and_resumes_after_restart(core: Any, emulator: KubeApiEmulator) -> None:
    start = core.list_node().metadata.resource_version
    resp = core.list_node(watch=True, resource_version=start, _preload_content=False)
    emulator.stop()
    assert resp.read() == b""  # the stream closed cleanly
    emulator.start()
    core.create_node(node_body("n"))
    assert collect(core.list_node, 1, resource_version=start) == [("ADDED", "n")]


def test_a_watch_asked_for_while_the_emulator_stops_is_refused_with_503(emulator: KubeApiEmulator) -> None:
    """A client re-watching in the moment between its stream's end and the server's exit would hold the
    shutdown up until its grace ran out; it is told to come back instead, and is served after the restart."""
    loop = asyncio.new_event_loop()
    rt = find_resource("", "v1", "nodes")
    assert rt is not None
    everything = (parse_label_selector(""), parse_field_selector("", lambda _: True))
    emulator.store.close_watchers()
    with pytest.raises(ApiError) as refused:
        emulator.store.watch(rt, None, *everything, None, loop)
    assert (refused.value.code, refused.value.reason) == (503, "ServiceUnavailable")
    emulator.stop()
    emulator.start()
    _, watcher = emulator.store.watch(rt, None, *everything, None, loop)
    emulator.store.unwatch(watcher)
    loop.close()
