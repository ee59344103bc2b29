"""Choosing the pod the kubelet allocates for, from the pods bound to the node (hami-protocol §5.4)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_allocator.pending import BrokenPod, PendingPod, next_pending, next_uuids
from hami_common import envvars
from hami_common.annotations import (
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    BIND_PHASE_SUCCESS,
    BIND_TIME,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
)
from hami_common.errors import NotFound
from hami_common.resources import GPU_PRIORITY

NODE = "n1"


def pod(
    name: str,
    *,
    bind: int = 1,
    phase: str = "Pending",
    node: str = NODE,
    bind_phase: str = BIND_PHASE_ALLOCATING,
    devices: str = "GPU-a,NVIDIA,100,10:;",
    containers: tuple[str, ...] = ("main",),
    **extra: Any,
) -> PendingPod:
    annotations = {VGPU_NODE: node, BIND_PHASE: bind_phase, DEVICES_TO_ALLOCATE: devices}
    if bind:
        annotations[BIND_TIME] = str(bind)
    body = {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": annotations, **extra},
        "spec": {"nodeName": node, "containers": [{"name": c} for c in containers]},
        "status": {"phase": phase},
    }
    return msgspec.convert(body, PendingPod)


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([pod("new", bind=20), pod("old", bind=10)], "old", id="the oldest bind wins"),
        pytest.param([pod("run", phase="Running"), pod("p", bind=30)], "p", id="a running pod is not pending"),
        pytest.param([pod("x", node="n2"), pod("p", bind=30)], "p", id="a pod placed on another node is skipped"),
        pytest.param([pod("nb", bind=0), pod("p", bind=30)], "p", id="a pod without bind-time is skipped"),
        pytest.param([pod("done", bind_phase="failed"), pod("p", bind=30)], "p", id="a failed pod is skipped"),
        pytest.param(
            [pod("s", bind=5, devices=";;"), pod("p", bind=30)],
            "p",
            id="a pod with nothing left to allocate is passed over",
        ),
        pytest.param(
            [pod("two", bind=5, devices="GPU-a,NVIDIA,1,1:GPU-b,NVIDIA,1,1:;"), pod("p", bind=30)],
            "p",
            id="a pod whose next entry wants another count is passed over",
        ),
        pytest.param([pod("ok", bind=5, bind_phase=BIND_PHASE_SUCCESS)], "ok", id="bind-phase success is accepted"),
    ],
)
def test_next_pending_picks_hamis_candidate(pods: list[PendingPod], expected: str) -> None:
    assert next_pending(pods, NODE, 1).pod.metadata.name == expected


def test_containers_served_but_not_yet_erased_are_skipped() -> None:
    two = pod("p", devices="GPU-a,NVIDIA,100,10:;GPU-b,NVIDIA,200,20:;", containers=("a", "b"))
    first = next_pending([two], NODE, 1)
    second = next_pending([two], NODE, 1, inflight={"uid-p": {"a"}})
    assert (first.grant.name, first.complete) == ("a", False)
    assert (second.grant.name, second.grant.devices[0].uuid, second.complete) == ("b", "GPU-b", True)
    with pytest.raises(NotFound):
        next_pending([two], NODE, 1, inflight={"uid-p": {"a", "b"}})


def test_a_served_container_is_skipped_whether_or_not_the_listing_shows_it_erased() -> None:
    before = pod("p", devices="GPU-a,NVIDIA,100,10:;GPU-b,NVIDIA,200,20:GPU-c,NVIDIA,200,20:;", containers=("a", "b"))
    after = pod("p", devices=";GPU-b,NVIDIA,200,20:GPU-c,NVIDIA,200,20:;;", containers=("a", "b"))
    for listing in (before, after):
        chosen = next_pending([listing], NODE, 2, inflight={"uid-p": {"a"}})
        assert (chosen.grant.name, chosen.complete) == ("b", True)


def test_no_candidate_gives_hamis_message() -> None:
    with pytest.raises(NotFound, match=f"no binding pod found on node {NODE}"):
        next_pending([pod("x", node="n2")], NODE, 1)


def test_count_mismatch_names_what_the_pod_wants() -> None:
    with pytest.raises(NotFound, match="ns/p wants 1"):
        next_pending([pod("p")], NODE, 2)


def test_gone_and_terminating_pods_are_never_chosen() -> None:
    pods = [pod("gone", bind=1), pod("dying", bind=2, deletionTimestamp="2026-01-01T00:00:00Z"), pod("p", bind=3)]
    assert next_pending(pods, NODE, 1, gone={"uid-gone"}).pod.metadata.name == "p"


def test_malformed_device_list_names_the_pod() -> None:
    with pytest.raises(BrokenPod, match="pod ns/bad") as caught:
        next_pending([pod("bad", devices="GPU-a,NVIDIA:;")], NODE, 1)
    assert caught.value.pod.metadata.name == "bad"


def test_disable_control_and_priority_are_read_from_the_container() -> None:
    body = msgspec.to_builtins(pod("p"))
    body["spec"]["containers"][0].update(
        env=[{"name": envvars.CUDA_DISABLE_CONTROL, "value": "true"}], resources={"limits": {GPU_PRIORITY: "0"}}
    )
    chosen = next_pending([msgspec.convert(body, PendingPod)], NODE, 1)
    assert chosen.grant.disable_control
    assert chosen.grant.priority == 0


def test_next_uuids_reads_the_next_grant_without_a_container_list() -> None:
    pods = [
        pod("later", bind=9, devices="GPU-z,NVIDIA,1,1:;"),
        pod("p", devices="GPU-a,NVIDIA,1,1:;GPU-b,NVIDIA,1,1:;", containers=("a", "b")),
    ]
    assert next_uuids(pods, NODE, 1) == ("GPU-a",)
    assert next_uuids(pods, NODE, 1, inflight={"uid-p": {"a"}}) == ("GPU-b",)
    assert next_uuids(pods, NODE, 2) == ()
    assert next_uuids([pod("bad", devices="GPU-a,NVIDIA:;")], NODE, 1) == ()


@settings(max_examples=200)
@given(value=st.text(alphabet=st.sampled_from("GPU-ab,NVIDIA:;0123456789 x"), max_size=60))
def test_any_device_list_is_chosen_or_refused_with_our_errors(value: str) -> None:
    try:
        chosen = next_pending([pod("p", devices=value)], NODE, 1)
    except (NotFound, BrokenPod):
        return
    assert len(chosen.grant.devices) == 1
    assert next_uuids([pod("p", devices=value)], NODE, 1) == (chosen.grant.devices[0].uuid,)
