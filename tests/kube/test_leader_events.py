"""Lease-based leader election and Events, against the emulator, with a fake monotonic clock."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from hami_common.kube import (
    Action,
    EventRecorder,
    KubeClient,
    LeaderElector,
    Lease,
    LeaseFollower,
    LeaseSpec,
    decide,
    holds_lease,
    reference_to,
)
from tests.kube.conftest import pod_body


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lease(holder: str | None, duration: int = 15) -> Lease:
    return Lease(spec=LeaseSpec(holder_identity=holder, lease_duration_seconds=duration))


@pytest.mark.parametrize(
    ("current", "observed", "now", "action"),
    [
        pytest.param(None, 0.0, 0.0, Action.CREATE, id="a missing lease is created"),
        pytest.param(lease("me"), 0.0, 100.0, Action.RENEW, id="our own lease is renewed even when late"),
        pytest.param(lease("other"), 0.0, 14.9, Action.WAIT, id="a live lease of another is waited for"),
        pytest.param(lease("other"), 0.0, 15.0, Action.TAKE, id="an expired lease of another is taken"),
        pytest.param(lease(""), 0.0, 1.0, Action.TAKE, id="a released lease is taken at once"),
    ],
)
def test_decide(current: Lease | None, observed: float, now: float, action: Action) -> None:
    assert decide(current, "me", observed, now) is action


def test_holds_lease_follows_hamis_hostname_prefix_rule() -> None:
    assert holds_lease(lease("sched-0_1234"), "sched-0", observed_at=0.0, now=10.0)
    assert not holds_lease(lease("sched-0_1234"), "sched-0", observed_at=0.0, now=15.0)
    assert not holds_lease(lease("sched-1_1234"), "sched-0", observed_at=0.0, now=1.0)


async def test_one_leader_at_a_time_and_takeover_after_expiry(kube: KubeClient, api_client: Any) -> None:
    clock = FakeClock()
    changes: list[tuple[str, bool]] = []
    a = LeaderElector(kube, "kube-system", "hami", "a", monotonic=clock, on_change=lambda v: changes.append(("a", v)))
    b = LeaderElector(kube, "kube-system", "hami", "b", monotonic=clock, on_change=lambda v: changes.append(("b", v)))
    assert await a.step() is True
    assert await b.step() is False
    clock.now += 5
    assert await a.step() is True  # renewed: b's observation restarts
    assert await b.step() is False
    clock.now += 16  # a stops renewing; b has seen the same lease for longer than its duration
    assert await b.step() is True
    assert await a.step() is False
    assert changes == [("a", True), ("b", True), ("a", False)]
    stored: Any = client.CoordinationV1Api(api_client).read_namespaced_lease("hami", "kube-system")
    assert stored.spec.holder_identity == "b"
    assert stored.spec.lease_transitions == 1


async def test_leader_that_cannot_renew_steps_down_before_the_lease_expires(kube: KubeClient, emulator: Any) -> None:
    clock = FakeClock()
    a = LeaderElector(kube, "kube-system", "hami", "a", monotonic=clock)
    assert await a.step() is True
    emulator.stop()
    clock.now += 5
    assert await a.step() is True, "within renew_deadline a failed renewal keeps the lead"
    clock.now += 6
    assert await a.step() is False
    emulator.start()


async def test_a_follower_leads_exactly_while_a_holder_with_its_prefix_keeps_the_lease(
    kube: KubeClient, emulator: Any
) -> None:
    """HAMi's extender rule: kube-scheduler "sched-a_<uuid>" holds the Lease, so extender "sched-a" leads;
    "sched-ab" is another host, not a prefix match; an expired or lost Lease makes nobody lead."""
    clock = FakeClock()
    scheduler_a = LeaderElector(
        kube, "kube-system", "hami-scheduler", "sched-a_1f2e", lease_duration=4, monotonic=clock
    )
    changes: list[bool] = []
    follower_a = LeaseFollower(
        kube, "kube-system", "hami-scheduler", "sched-a_", monotonic=clock, on_change=changes.append
    )
    follower_ab = LeaseFollower(kube, "kube-system", "hami-scheduler", "sched-ab_", monotonic=clock)
    assert await follower_a.step() is False, "no Lease yet: nobody leads"
    assert await scheduler_a.step() is True
    assert await follower_a.step() is True
    assert await follower_ab.step() is False
    clock.now += 3
    assert await follower_a.step() is True, "the Lease is still live"
    clock.now += 2  # the holder stopped renewing (SIGKILL): 4 s after the last change was seen, it has expired
    assert await follower_a.step() is False
    scheduler_ab = LeaderElector(
        kube, "kube-system", "hami-scheduler", "sched-ab_9c", lease_duration=4, monotonic=clock
    )
    assert await scheduler_ab.step() is False, "a new candidate first watches the Lease for its whole duration"
    clock.now += 5
    assert await scheduler_ab.step() is True
    assert await follower_ab.step() is True
    assert await follower_a.step() is False
    emulator.stop()
    assert await follower_ab.step() is True, "an unreadable Lease is trusted until it expires"
    clock.now += 5
    assert await follower_ab.step() is False
    emulator.start()
    assert changes == [True, False]


async def test_recorded_event_is_listed_for_its_pod(kube: KubeClient, core: Any) -> None:
    pod = await kube.get_pod("default", core.create_namespaced_pod("default", pod_body("p")).metadata.name)
    recorder = EventRecorder(kube, component="hami-scheduler")
    assert await recorder.record(reference_to(pod, "Pod"), "Normal", "BindingSucceed", "bound to n1")
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=p,involvedObject.kind=Pod").items
    assert [(e.type, e.reason, e.message, e.source.component) for e in events] == [
        ("Normal", "BindingSucceed", "bound to n1", "hami-scheduler")
    ]


async def test_event_recording_failure_is_reported_not_raised(kube: KubeClient, emulator: Any) -> None:
    recorder = EventRecorder(kube, component="hami-scheduler")
    pod_ref = reference_to(Lease(), "Pod")
    emulator.stop()
    assert await recorder.record(pod_ref, "Warning", "BindingFailed", "x") is False
    emulator.start()
