"""``hami status``'s pending reasons: the latest FailedScheduling Event of each pod, nothing else."""

from __future__ import annotations

from hami_cli.report import pending_reasons, placement_rows
from hami_common.kube import Event, ObjectMeta, ObjectReference, Pod
from hami_sim.scheduler import is_unschedulable_message, unschedulable_message


def _event(uid: str, reason: str, message: str, stamp: str, kind: str = "Pod") -> Event:
    return Event(
        metadata=ObjectMeta(name=f"{uid}.{stamp}", namespace="default"),
        involved_object=ObjectReference(kind=kind, namespace="default", name=uid, uid=uid),
        reason=reason,
        message=message,
        last_timestamp=stamp,
    )


def test_the_latest_failed_scheduling_message_of_each_pod_is_its_reason() -> None:
    events = [
        _event("a", "FailedScheduling", "0/2 nodes are available: old", "2026-11-29T10:00:00Z"),
        _event("a", "FailedScheduling", "0/2 nodes are available: CardInsufficientMemory", "2026-11-29T10:00:05Z"),
        _event("a", "Scheduled", "bound", "2026-11-29T10:00:09Z"),
        _event("b", "FilteringFailed", "not a scheduler verdict", "2026-11-29T10:00:01Z"),
        _event("c", "FailedScheduling", "about a node", "2026-11-29T10:00:01Z", kind="Node"),
    ]
    assert pending_reasons(events) == {"a": "0/2 nodes are available: CardInsufficientMemory"}


def test_a_pending_pod_shows_its_reason_and_one_without_says_it_waits() -> None:
    pods = [
        Pod(metadata=ObjectMeta(name="big", namespace="default", uid="a")),
        Pod(metadata=ObjectMeta(name="new", namespace="default", uid="n")),
    ]
    rows = placement_rows(pods, {"a": "0/2 nodes are available: CardInsufficientMemory"})
    assert rows == [
        ("default/big", "-", "-", "Pending: 0/2 nodes are available: CardInsufficientMemory"),
        ("default/new", "-", "-", "Pending: waiting to be scheduled"),
    ]


def test_only_a_no_node_fits_verdict_stands_a_bind_error_is_retried() -> None:
    assert is_unschedulable_message(
        "0/7 nodes are available: 2 2/2 CardInsufficientMemory, 3 Insufficient nvidia.com/gpu."
    )
    assert is_unschedulable_message(unschedulable_message({"n": "CardUuidMismatch"}, 1))  # the stand-in's wording
    assert not is_unschedulable_message("node mig-node-1 has been locked within 300s: node lock contention")
    assert not is_unschedulable_message("0/x nodes are available: not kube-scheduler's count")
    assert not is_unschedulable_message("")
