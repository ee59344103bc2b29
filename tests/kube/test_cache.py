"""Watch caches over the emulator: typed changes, resume after a restart, re-list after 410 Gone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hami_common.kube import Backoff, Change, KubeClient, Node, Pod, WatchCache, node_source, pod_source
from hami_sim.kubeapi import KubeApiEmulator, find_resource
from hami_sim.waiting import eventually
from tests.kube.conftest import node_body, pod_body

FAST = Backoff(initial=0.01, cap=0.1)


@pytest.fixture
async def pods(kube: KubeClient) -> AsyncIterator[tuple[WatchCache[Pod], list[Change[Pod]]]]:
    cache: WatchCache[Pod] = WatchCache(pod_source(kube), backoff=FAST, name="pods")
    changes: list[Change[Pod]] = []
    cache.add_handler(changes.append)
    task = asyncio.create_task(cache.run())
    async with asyncio.timeout(10):
        await cache.synced.wait()
    yield cache, changes
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def seen(changes: list[Change[Pod]]) -> list[tuple[str, str]]:
    return [(c.type, c.obj.metadata.name) for c in changes]


async def test_handlers_receive_typed_changes_in_order(
    pods: tuple[WatchCache[Pod], list[Change[Pod]]], core: Any
) -> None:
    cache, changes = pods
    core.create_namespaced_pod("default", pod_body("p"))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    core.delete_namespaced_pod("p", "default")
    await eventually(lambda: len(changes) == 4, what="four changes")
    # a delete first marks the pod (deletionTimestamp, MODIFIED), then removes it, as kube-apiserver does
    assert seen(changes) == [("ADDED", "p"), ("MODIFIED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]
    assert changes[2].obj.metadata.deletion_timestamp is not None
    assert isinstance(changes[1].obj, Pod)
    assert changes[1].old is not None
    assert changes[1].obj.metadata.labels == {"a": "b"}
    assert changes[1].old.metadata.labels == {}
    assert cache.get("default", "p") is None


async def test_cache_starts_with_existing_objects(kube: KubeClient, core: Any) -> None:
    core.create_node(node_body("n1"))
    cache: WatchCache[Node] = WatchCache(node_source(kube), backoff=FAST, name="nodes")
    task = asyncio.create_task(cache.run())
    try:
        async with asyncio.timeout(10):
            await cache.synced.wait()
        node = cache.get("", "n1")
        assert isinstance(node, Node)
        assert node.metadata.name == "n1"
    finally:
        task.cancel()


async def test_watch_cache_survives_an_emulator_restart_without_relisting(
    pods: tuple[WatchCache[Pod], list[Change[Pod]]], core: Any, emulator: KubeApiEmulator
) -> None:
    cache, changes = pods
    core.create_namespaced_pod("default", pod_body("before"))
    await eventually(lambda: cache.get("default", "before"), what="pod before restart")
    emulator.restart()
    core.create_namespaced_pod("default", pod_body("after"))
    await eventually(lambda: cache.get("default", "after"), what="pod after restart")
    assert cache.stats.lists == 1, "the cache resumed from its resourceVersion instead of listing again"
    assert cache.stats.watches >= 2
    assert seen(changes) == [("ADDED", "before"), ("ADDED", "after")]


async def test_watch_cache_relists_after_410_and_reports_what_it_missed(
    pods: tuple[WatchCache[Pod], list[Change[Pod]]], core: Any, emulator: KubeApiEmulator
) -> None:
    cache, changes = pods
    core.create_namespaced_pod("default", pod_body("old"))
    await eventually(lambda: cache.get("default", "old"), what="first pod")
    emulator.stop()
    pods_type = find_resource("", "v1", "pods")
    assert pods_type is not None
    emulator.store.delete(pods_type, "default", "old")
    emulator.store.create(pods_type, "default", pod_body("new"))
    emulator.compact()
    emulator.start()
    await eventually(lambda: cache.get("default", "new"), what="pod created while the history was compacted")
    assert cache.get("default", "old") is None
    assert cache.stats.gone == 1
    assert cache.stats.lists == 2
    assert seen(changes) == [("ADDED", "old"), ("DELETED", "old"), ("ADDED", "new")]


async def test_bookmarks_advance_a_selective_cache(kube: KubeClient, core: Any, emulator: KubeApiEmulator) -> None:
    cache: WatchCache[Pod] = WatchCache(pod_source(kube, label_selector="app=gpu"), backoff=FAST)
    task = asyncio.create_task(cache.run())
    try:
        async with asyncio.timeout(10):
            await cache.synced.wait()
        unrelated = core.create_namespaced_pod("default", pod_body("other"))
        target = unrelated.metadata.resource_version
        await eventually(lambda: int(cache.resource_version or 0) >= int(target), what="bookmark")
        assert len(cache) == 0
    finally:
        task.cancel()


async def test_handler_failure_does_not_stop_the_cache(
    pods: tuple[WatchCache[Pod], list[Change[Pod]]], core: Any
) -> None:
    cache, changes = pods

    def broken(_change: Change[Pod]) -> None:
        raise RuntimeError("handler bug")

    cache.add_handler(broken)
    core.create_namespaced_pod("default", pod_body("a"))
    core.create_namespaced_pod("default", pod_body("b"))
    await eventually(lambda: len(changes) == 2, what="both changes")
    assert cache.stats.handler_errors == 2
