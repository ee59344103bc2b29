"""The ledger, the watch readers and the hand-off as plain values (no I/O)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_common.annotations import (
    DEVICES_ALLOCATED,
    NODE_REGISTER,
    VGPU_NODE,
    ContainerDevice,
    encode_node_devices,
    encode_pod_devices,
)
from hami_common.errors import Conflict
from hami_common.kube import (
    Change,
    Container,
    ContainerState,
    ContainerStateTerminated,
    ContainerStatus,
    Node,
    ObjectMeta,
    Pod,
    PodSpec,
    PodStatus,
)
from hami_common.scheduling import NamespaceQuota
from hami_extender.handoff import NodeHandoff
from hami_extender.ledger import Ledger
from hami_extender.sync import LedgerSync, booking_from, registration_from
from tests.extender.cluster import cards


def node(name: str, n: int = 2, **extra: str) -> Node:
    annotations = {NODE_REGISTER: encode_node_devices(cards(name, n=n)), **extra}
    return Node(metadata=ObjectMeta(name=name, annotations=annotations))


def pod(
    name: str,
    node_name: str,
    grants: list[list[ContainerDevice]],
    *,
    init: int = 0,
    phase: str = "Running",
    init_done: bool = False,
) -> Pod:
    encoded = encode_pod_devices(grants)
    statuses = tuple(
        ContainerStatus(name=f"i{i}", state=ContainerState(terminated=ContainerStateTerminated(exit_code=0)))
        for i in range(init)
    )
    return Pod(
        metadata=ObjectMeta(
            name=name, namespace="ns", uid=f"uid-{name}", annotations={VGPU_NODE: node_name, DEVICES_ALLOCATED: encoded}
        ),
        spec=PodSpec(
            init_containers=tuple(Container(name=f"i{i}") for i in range(init)),
            containers=tuple(Container(name=f"c{i}") for i in range(len(grants) - init)),
        ),
        status=PodStatus(phase=phase, init_container_statuses=statuses if init_done else ()),
    )


def gpu(uuid: str, mem: int, cores: int = 0) -> ContainerDevice:
    return ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=mem, usedcores=cores)


def test_a_pods_booking_is_its_collapsed_annotation() -> None:
    b = booking_from(pod("p", "n1", [[gpu("GPU-n1-0", 1000, 80)], [gpu("GPU-n1-0", 200, 20)]], init=1))
    assert b is not None
    assert [(c.uuid, c.usedmem, c.usedcores, c.slots) for c in b.charges] == [("GPU-n1-0", 1000, 80, 1)]


def test_finished_init_containers_stop_counting() -> None:
    p = pod("p", "n1", [[gpu("GPU-n1-0", 1000, 80)], [gpu("GPU-n1-0", 200, 20)]], init=1, init_done=True)
    b = booking_from(p)
    assert b is not None
    assert [(c.usedmem, c.usedcores) for c in b.charges] == [(200, 20)]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_holds_nothing(phase: str) -> None:
    assert booking_from(pod("p", "n1", [[gpu("GPU-n1-0", 1)]], phase=phase)) is None


def test_watch_changes_keep_usage_and_quota_current() -> None:
    ledger = Ledger()
    sync = LedgerSync(ledger)
    sync.on_node(Change("ADDED", node("n1")))
    ledger.set_quota("ns", NamespaceQuota(memory_limit=10_000))
    p = pod("p", "n1", [[gpu("GPU-n1-1", 3000, 30)]])
    sync.on_pod(Change("ADDED", p))
    view = ledger.view("n1")
    assert view is not None
    assert [(d.used, d.usedmem, d.usedcores) for d in view.usage.devices] == [(0, 0, 0), (1, 3000, 30)]
    assert ledger.quota("ns") == NamespaceQuota(memory_limit=10_000, used_memory=3000, used_cores=30)
    sync.on_pod(Change("DELETED", p))
    view = ledger.view("n1")
    assert view is not None
    assert all(d.used == 0 for d in view.usage.devices)
    assert ledger.quota("ns") == NamespaceQuota(memory_limit=10_000)


def test_a_withdrawn_booking_stays_withdrawn_until_the_pod_is_placed_anew() -> None:
    ledger = Ledger()
    sync = LedgerSync(ledger)
    sync.on_node(Change("ADDED", node("n1")))
    p = pod("p", "n1", [[gpu("GPU-n1-1", 3000, 30)]])
    sync.on_pod(Change("ADDED", p))
    ledger.withdraw("uid-p")  # a refused bind
    sync.on_pod(Change("MODIFIED", p))  # the same placement, seen again
    assert ledger.booking("uid-p") is None
    moved = pod("p", "n1", [[gpu("GPU-n1-0", 3000, 30)]])  # filtered again, to another card
    sync.on_pod(Change("MODIFIED", moved))
    booked = ledger.booking("uid-p")
    assert booked is not None
    assert booked.charges[0].uuid == "GPU-n1-0"
    sync.on_pod(Change("MODIFIED", p))  # no longer withdrawn: the watch books what the pod says
    rebooked = ledger.booking("uid-p")
    assert rebooked is not None
    assert rebooked.charges[0].uuid == "GPU-n1-1"
    ledger.withdraw("uid-p")
    sync.on_pod(Change("DELETED", p))
    assert ledger.withdrawn("uid-p") is None


def test_a_status_write_does_not_book_back_a_placement_filter_has_replaced() -> None:
    """A pod filtered again is reserved anew in memory before its patch lands; meanwhile the kubelet's status
    writes arrive with the old annotations. They change nothing the ledger reads, so they are not decoded
    again, and the new reservation stands (re-read, they booked the old cards back over it)."""
    ledger = Ledger()
    sync = LedgerSync(ledger)
    sync.on_node(Change("ADDED", node("n1")))
    old = pod("p", "n1", [[gpu("GPU-n1-1", 3000, 30)]], phase="Pending")
    sync.on_pod(Change("ADDED", old))
    again = booking_from(pod("p", "n1", [[gpu("GPU-n1-0", 3000, 30)]]))
    assert again is not None
    ledger.release("uid-p")
    ledger.book(again)  # Filter's new reservation, its patch not seen yet
    status = msgspec.structs.replace(old, status=PodStatus(phase="Pending", message="pulling"))
    sync.on_pod(Change("MODIFIED", status, old))
    booked = ledger.booking("uid-p")
    assert booked is not None
    assert booked.charges[0].uuid == "GPU-n1-0"
    done = msgspec.structs.replace(old, status=PodStatus(phase="Failed"))
    sync.on_pod(Change("MODIFIED", done, status))  # a phase the ledger reads: the pod holds nothing now
    assert ledger.booking("uid-p") is None


def test_a_malformed_annotation_is_counted_and_skipped() -> None:
    ledger = Ledger()
    sync = LedgerSync(ledger)
    bad = Pod(metadata=ObjectMeta(name="p", uid="u", annotations={VGPU_NODE: "n1", DEVICES_ALLOCATED: "x,y:;"}))
    sync.on_pod(Change("ADDED", bad))
    sync.on_node(Change("ADDED", Node(metadata=ObjectMeta(name="n2", annotations={NODE_REGISTER: "{"}))))
    assert sync.malformed == 2
    assert ledger.booking("u") is None
    assert "n2" not in ledger


def test_a_node_without_cards_is_not_registered() -> None:
    assert registration_from(Node(metadata=ObjectMeta(name="n", annotations={NODE_REGISTER: "[]"}))) is None


def test_candidates_come_best_first_for_each_policy() -> None:
    ledger = Ledger()
    sync = LedgerSync(ledger)
    for name in ("a", "b", "c"):
        sync.on_node(Change("ADDED", node(name, n=1)))
    sync.on_pod(Change("ADDED", pod("p", "b", [[gpu("GPU-b-0", 4000, 50)]])))
    binpack, missing = ledger.candidates(["a", "b", "c", "zz"], spread=False)
    assert ([v.usage.name for v in binpack], missing) == (["b", "c", "a"], ["zz"])
    spread, _ = ledger.candidates(["b", "c"], spread=True)
    assert [v.usage.name for v in spread] == ["c", "b"]


def test_unregistered_names_follow_nodes_that_register_and_leave() -> None:
    ledger = Ledger()
    sync = LedgerSync(ledger)
    names = ["a", "b", "c"]
    wanted = frozenset(names)
    sync.on_node(Change("ADDED", node("a", n=1)))
    assert ledger.candidates(names, False, wanted)[1] == ["b", "c"]
    sync.on_pod(Change("ADDED", pod("p", "a", [[gpu("GPU-a-0", 1000, 10)]])))  # usage changes, membership not
    assert ledger.candidates(names, False, wanted)[1] == ["b", "c"]
    sync.on_node(Change("ADDED", node("c", n=1)))
    assert ledger.candidates(names, False, wanted)[1] == ["b"]
    sync.on_node(Change("DELETED", node("a", n=1)))
    assert ledger.candidates(names, False, wanted)[1] == ["a", "b"]


events = st.lists(
    st.tuples(
        st.sampled_from(["add", "delete"]),
        st.integers(0, 5),
        st.sampled_from(["n1", "n2"]),
        st.integers(0, 1),
        st.integers(1, 4000),
    ),
    max_size=30,
)


@given(events)
@settings(max_examples=60, deadline=None)
def test_an_incremental_ledger_equals_one_rebuilt_from_the_final_pods(
    steps: list[tuple[str, int, str, int, int]],
) -> None:
    incremental = Ledger()
    sync = LedgerSync(incremental)
    for name in ("n1", "n2"):
        sync.on_node(Change("ADDED", node(name)))
    alive: dict[int, Pod] = {}
    for action, i, node_name, card, mem in steps:
        p = pod(f"p{i}", node_name, [[gpu(f"GPU-{node_name}-{card}", mem, 5)]])
        if action == "add":
            sync.on_pod(Change("MODIFIED" if i in alive else "ADDED", p, alive.get(i)))
            alive[i] = p
        elif i in alive:
            sync.on_pod(Change("DELETED", alive.pop(i)))
    rebuilt = Ledger()
    fresh = LedgerSync(rebuilt)
    for p in alive.values():  # a restart: pods listed before the nodes, in any order
        fresh.on_pod(Change("ADDED", p))
    for name in ("n2", "n1"):
        fresh.on_node(Change("ADDED", node(name)))
    assert rebuilt.state() == incremental.state()


async def test_handoff_waits_for_the_release_of_the_same_node_only() -> None:
    handoff = NodeHandoff()
    await handoff.acquire("n1", "a", "ns", "a", expected=1, wait=1)
    await asyncio.wait_for(handoff.acquire("n2", "b", "ns", "b", expected=1, wait=1), 0.5)
    waiting = asyncio.create_task(handoff.acquire("n1", "c", "ns", "c", expected=1, wait=5))
    await asyncio.sleep(0)  # let the waiter block on the hold
    assert not waiting.done()
    assert handoff.served("a", ok=True) is not None
    hold = await asyncio.wait_for(waiting, 1)
    assert (hold.node, hold.uid) == ("n1", "c")


async def test_handoff_refuses_after_the_wait_with_hamis_contention_message() -> None:
    handoff = NodeHandoff()
    await handoff.acquire("n1", "a", "ns", "a", expected=1, wait=1)
    with pytest.raises(Conflict, match="node lock contention"):
        await handoff.acquire("n1", "b", "ns", "b", expected=1, wait=0)


async def test_handoff_ends_only_when_every_gpu_container_is_served() -> None:
    handoff = NodeHandoff()
    await handoff.acquire("n1", "a", "ns", "a", expected=2, wait=1)
    assert handoff.served("a", ok=True) is None
    assert handoff.holder("n1") is not None
    assert handoff.served("a", ok=True) is not None
    assert handoff.holder("n1") is None


async def test_an_expired_hold_is_taken_over() -> None:
    now = [0.0]
    handoff = NodeHandoff(expiry=10, monotonic=lambda: now[0])
    await handoff.acquire("n1", "a", "ns", "a", expected=1, wait=0)
    now[0] = 10.0
    hold = await handoff.acquire("n1", "b", "ns", "b", expected=1, wait=0)
    assert hold.uid == "b"
    assert handoff.release("a") is None
