"""Choosing the pod the kubelet allocates for, from the pods bound to the node (hami-protocol §5.4)."""

from __future__ import annotations

import functools
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_allocator import pending
from hami_allocator.pending import BrokenPod, PendingPod
from hami_common import envvars
from hami_common.annotations import (
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    BIND_PHASE_SUCCESS,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    GRANT_SIGNATURE,
    VGPU_NODE,
)
from hami_common.errors import NotFound
from hami_common.grants import GrantKey
from hami_common.resources import GPU_PRIORITY

NODE = "n1"
KEY = GrantKey(b"the key the extender signs grants with, 32+ bytes")
next_pending = functools.partial(pending.next_pending, key=KEY)
next_uuids = functools.partial(pending.next_uuids, key=KEY)


def pod(
    name: str,
    *,
    bind: int = 1,
    phase: str = "Pending",
    node: str = NODE,
    bind_phase: str = BIND_PHASE_ALLOCATING,
    devices: str = "GPU-a,NVIDIA,100,10:;",
    containers: tuple[str, ...] = ("main",),
    allocated: str | None = None,
    signed_by: GrantKey | None = KEY,
    **extra: Any,
) -> PendingPod:
    """A pod as the extender left it: ``allocated`` (default: ``devices``) signed with ``signed_by``."""
    allocated = devices if allocated is None else allocated
    annotations = {VGPU_NODE: node, BIND_PHASE: bind_phase, DEVICES_TO_ALLOCATE: devices, DEVICES_ALLOCATED: allocated}
    if signed_by is not None:
        annotations[GRANT_SIGNATURE] = signed_by.sign(f"uid-{name}", node, allocated)
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
    after = pod(
        "p",
        devices=";GPU-b,NVIDIA,200,20:GPU-c,NVIDIA,200,20:;;",
        allocated="GPU-a,NVIDIA,100,10:;GPU-b,NVIDIA,200,20:GPU-c,NVIDIA,200,20:;",
        containers=("a", "b"),
    )
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


# --- forged grants (HAMi#3041): annotations alone never make an allocation ---------------------------------

FORGED = "GPU-a,NVIDIA,80000,100:;"


def _with(p: PendingPod, **annotations: str) -> PendingPod:
    meta = msgspec.structs.replace(p.metadata, annotations={**p.metadata.annotations, **annotations})
    return msgspec.structs.replace(p, metadata=meta)


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param(pod("f", devices=FORGED, signed_by=None), id="no signature"),
        pytest.param(pod("f", devices=FORGED, signed_by=GrantKey(b"x" * 32)), id="signed with another key"),
        pytest.param(_with(pod("f", devices=FORGED), **{GRANT_SIGNATURE: "v1.AAAA"}), id="a made-up signature"),
        pytest.param(
            _with(pod("f"), **{DEVICES_TO_ALLOCATE: FORGED, DEVICES_ALLOCATED: FORGED}),
            id="devices changed after signing",
        ),
        pytest.param(_with(pod("f"), **{DEVICES_TO_ALLOCATE: FORGED}), id="to-allocate differs from the signed list"),
        pytest.param(
            _with(
                pod("f", devices=FORGED),
                **{GRANT_SIGNATURE: pod("victim", devices=FORGED).metadata.annotations[GRANT_SIGNATURE]},
            ),
            id="signature copied from another pod",
        ),
        pytest.param(
            _with(pod("f", node="n2"), **{VGPU_NODE: NODE}),
            id="signed for another node",
        ),
    ],
)
def test_a_grant_the_scheduler_did_not_sign_is_never_served(forged: PendingPod) -> None:
    with pytest.raises(NotFound, match="ns/f not served"):
        next_pending(
            [msgspec.structs.replace(forged, spec=msgspec.structs.replace(forged.spec, node_name=NODE))], NODE, 1
        )
    assert next_uuids([forged], NODE, 1) == ()


def test_a_forged_pod_does_not_hide_a_signed_one_behind_it() -> None:
    forged = pod("f", bind=1, devices=FORGED, signed_by=None)
    chosen = next_pending([forged, pod("p", bind=2)], NODE, 1)
    assert chosen.pod.metadata.name == "p"
    assert chosen.grant.devices[0].usedmem_mib == 100


def test_without_a_key_no_annotation_grant_is_served() -> None:
    with pytest.raises(NotFound, match="no grant key is configured"):
        pending.next_pending([pod("p")], NODE, 1)
    assert pending.next_uuids([pod("p")], NODE, 1) == ()
