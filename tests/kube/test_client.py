"""KubeClient against the emulator: merge patches as HAMi writes them, guarded writes, binding."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hami_common.annotations import VGPU_NODE
from hami_common.errors import Conflict, InvalidInput, NotFound, TransientError
from hami_common.kube import Backoff, KubeClient, KubeSettings, Node, update_node_annotations
from hami_sim.kubeapi import KubeApiEmulator
from tests.kube.conftest import node_body, pod_body

FAST = Backoff(initial=0.005, cap=0.05)


async def test_pod_annotation_patch_sets_the_vgpu_node_label_too(kube: KubeClient, core: Any) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    pod = await kube.patch_pod_annotations("default", "p", {VGPU_NODE: "n1", "example.com/a": "1"})
    assert pod.metadata.annotations == {VGPU_NODE: "n1", "example.com/a": "1"}
    assert pod.metadata.labels == {VGPU_NODE: "n1"}
    assert core.list_namespaced_pod("default", label_selector=f"{VGPU_NODE}=n1").items[0].metadata.name == "p"


async def test_pod_annotation_patch_without_vgpu_node_leaves_labels_alone(kube: KubeClient, core: Any) -> None:
    core.create_namespaced_pod("default", pod_body("p", labels={"app": "x"}))
    pod = await kube.patch_pod_annotations("default", "p", {"example.com/a": "1"})
    assert pod.metadata.labels == {"app": "x"}


async def test_none_removes_an_annotation(kube: KubeClient, core: Any) -> None:
    core.create_node(node_body("n1"))
    await kube.patch_node_annotations("n1", {"example.com/a": "1", "example.com/b": "2"})
    node = await kube.patch_node_annotations("n1", {"example.com/a": None})
    assert node.metadata.annotations == {"example.com/b": "2"}


async def test_patch_with_stale_resource_version_raises_conflict(kube: KubeClient, core: Any) -> None:
    first = core.create_node(node_body("n1"))
    await kube.patch_node_annotations("n1", {"example.com/a": "1"})
    with pytest.raises(Conflict):
        await kube.patch_node_annotations(
            "n1", {"example.com/b": "2"}, resource_version=first.metadata.resource_version
        )


async def test_errors_map_to_project_types(kube: KubeClient, core: Any) -> None:
    with pytest.raises(NotFound):
        await kube.get_pod("default", "ghost")
    with pytest.raises(InvalidInput):
        await kube.list_pods(label_selector="a in (")


async def test_eight_concurrent_guarded_writers_all_land(kube: KubeClient, core: Any) -> None:
    core.create_node(node_body("gpu-node"))
    writers = [f"example.com/writer-{i}" for i in range(8)]

    async def add_own(key: str) -> int:
        result = await update_node_annotations(
            kube, "gpu-node", lambda _node: {key: "present"}, attempts=40, backoff=FAST
        )
        return result.conflicts

    conflicts = await asyncio.gather(*(add_own(key) for key in writers))
    annotations = core.read_node("gpu-node").metadata.annotations
    assert all(annotations.get(key) == "present" for key in writers)
    assert sum(conflicts) > 0, "eight writers racing on one node should have lost some races"


async def test_guarded_writer_recomputes_from_the_fresh_object(kube: KubeClient, core: Any) -> None:
    core.create_node(node_body("n1"))
    await kube.patch_node_annotations("n1", {"example.com/count": "0"})
    seen: list[str] = []

    def bump(node: Node) -> dict[str, str | None]:
        value = node.metadata.annotations["example.com/count"]
        seen.append(value)
        if len(seen) == 1:  # another writer slips in between our read and our write
            core.patch_node("n1", {"metadata": {"annotations": {"example.com/count": "5"}}})
        return {"example.com/count": str(int(value) + 1)}

    result = await update_node_annotations(kube, "n1", bump, backoff=FAST)
    assert seen == ["0", "5"]
    assert result.conflicts == 1
    assert result.value.metadata.annotations["example.com/count"] == "6"


async def test_bind_sets_node_despite_the_clients_decoding_bug(kube: KubeClient, core: Any) -> None:
    pod = core.create_namespaced_pod("default", pod_body("p"))
    await kube.bind_pod("default", "p", "n1", uid=pod.metadata.uid, annotations={"example.com/bound": "yes"})
    bound = await kube.get_pod("default", "p")
    assert bound.spec.node_name == "n1"
    assert bound.metadata.annotations == {"example.com/bound": "yes"}


async def test_bind_of_bound_pod_is_conflict_not_retried_and_pod_stays(
    kube: KubeClient, core: Any, emulator: KubeApiEmulator
) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    await kube.bind_pod("default", "p", "n1")
    path = "/api/v1/namespaces/default/pods/p/binding"
    with pytest.raises(Conflict, match="already assigned"):
        await kube.bind_pod("default", "p", "n2")
    assert emulator.count("POST", path) == 2, "one POST per bind: the conflicting bind was not retried"
    assert (await kube.get_pod("default", "p")).spec.node_name == "n1"


async def test_bind_with_apiserver_down_is_transient_and_not_reported_bound(
    kube: KubeClient, core: Any, emulator: KubeApiEmulator
) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    emulator.stop()
    with pytest.raises(TransientError):
        await kube.bind_pod("default", "p", "n1")
    emulator.start()
    assert (await kube.get_pod("default", "p")).spec.node_name == ""


async def test_list_pods_pages_through_everything(kube: KubeClient, core: Any) -> None:
    for i in range(3):
        core.create_namespaced_pod("default", pod_body(f"p{i}"))
    pods, version = await kube.list_pods("default")
    assert [p.metadata.name for p in pods] == ["p0", "p1", "p2"]
    assert int(version) > 0
    bound, _ = await kube.list_pods(field_selector="metadata.name=p1")
    assert [p.metadata.name for p in bound] == ["p1"]


async def test_resource_quota_reads(kube: KubeClient, core: Any) -> None:
    quota = {"metadata": {"name": "gpu"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "2048"}}}
    core.create_namespaced_resource_quota("default", quota)
    assert [q.spec.hard for q in await kube.list_resource_quotas()] == [{"limits.nvidia.com/gpumem": "2048"}]
    assert (await kube.get_resource_quota("default", "gpu")).metadata.name == "gpu"


async def test_settings_load_from_flags_and_environment() -> None:
    from hami_common.settings import load

    settings = load(KubeSettings, ["--kubeconfig", "/k"], env={"HAMI_KUBE_TIMEOUT": "3.5"})
    assert (settings.kubeconfig, settings.kube_timeout) == ("/k", 3.5)


def test_missing_kubeconfig_is_invalid_input(tmp_path: Any) -> None:
    with pytest.raises(InvalidInput, match="absent: no such file"):
        KubeClient.from_settings(KubeSettings(kubeconfig=str(tmp_path / "absent")))
