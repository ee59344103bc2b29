"""Telling the pod an Allocate is for from the kubelet's PodResources List (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_allocator.admitting import SpecPod, admitting
from hami_common.errors import NotFound
from hami_common.kube import (
    Container,
    ContainerStatus,
    ObjectMeta,
    Pod,
    PodSpec,
    PodStatus,
    ResourceRequirements,
)
from hami_common.podresources import ListedContainer, ListedPod

GPU = "nvidia.com/gpu"


def ctr(name: str, gpus: str | None = "1") -> Container:
    limits = {GPU: gpus} if gpus is not None else {}
    return Container(name=name, resources=ResourceRequirements(limits=limits))


def pod(name: str, *containers: Container, init: tuple[Container, ...] = (), started_init: bool = False) -> Pod:
    statuses = tuple(ContainerStatus(name=c.name) for c in init) if started_init else ()
    return Pod(
        metadata=ObjectMeta(name=name, namespace="ns", uid=f"uid-{name}"),
        spec=PodSpec(containers=containers, init_containers=init),
        status=PodStatus(init_container_statuses=statuses),
    )


def listed(name: str, **held: tuple[str, ...]) -> ListedPod:
    return ListedPod("ns", name, tuple(ListedContainer(c, {GPU: ids} if ids else {}) for c, ids in held.items()))


def by_key(*pods: Pod) -> dict[tuple[str, str], SpecPod]:
    return {(p.metadata.namespace, p.metadata.name): p for p in pods}


def test_the_pod_with_a_gpu_container_holding_nothing_is_the_one_admitted() -> None:
    running, new, cpu = pod("running", ctr("main")), pod("new", ctr("main")), pod("cpu", ctr("main", None))
    found = admitting(
        [listed("running", main=("d1",)), listed("new", main=()), listed("cpu", main=())],
        by_key(running, new, cpu),
        GPU,
        "n1",
    )
    assert (found.uid, found.waiting) == ("uid-new", frozenset({"main"}))


def test_no_waiting_pod_is_refused_naming_the_node_and_resource() -> None:
    running = pod("running", ctr("main"))
    with pytest.raises(NotFound, match=r"node n1 lists no pod waiting for nvidia.com/gpu"):
        admitting([listed("running", main=("d1",))], by_key(running), GPU, "n1")


def test_two_waiting_pods_are_refused_naming_both() -> None:
    a, b = pod("a", ctr("main")), pod("b", ctr("main"))
    with pytest.raises(NotFound, match=r"several pods waiting .*ns/a, ns/b"):
        admitting([listed("a", main=()), listed("b", main=())], by_key(a, b), GPU, "n1")


def test_a_listed_pod_missing_from_the_watch_is_not_judged() -> None:
    new = pod("new", ctr("main"))
    found = admitting([listed("ghost", main=()), listed("new", main=())], by_key(new), GPU, "n1")
    assert found.name == "new"


def test_the_second_container_waits_once_the_first_holds_devices() -> None:
    two = pod("two", ctr("a"), ctr("b"))
    found = admitting([listed("two", a=("d1",), b=())], by_key(two), GPU, "n1")
    assert found.waiting == frozenset({"b"})


def test_a_pod_with_gpus_only_in_an_init_container_is_taken_when_nobody_else_waits() -> None:
    init_only = pod("init", ctr("main", None), init=(ctr("setup"),))
    found = admitting([listed("init", main=())], by_key(init_only), GPU, "n1")
    assert found.waiting == frozenset({"setup"})
    started = pod("init", ctr("main", None), init=(ctr("setup"),), started_init=True)
    with pytest.raises(NotFound):
        admitting([listed("init", main=())], by_key(started), GPU, "n1")
    waiting = pod("new", ctr("main"))
    found = admitting([listed("init", main=()), listed("new", main=())], by_key(init_only, waiting), GPU, "n1")
    assert found.name == "new"  # a pod with a listed container waiting comes first


def test_a_gpu_count_that_cannot_be_read_counts_as_asking() -> None:
    odd = pod("odd", ctr("main", "1.5"))
    assert admitting([listed("odd", main=())], by_key(odd), GPU, "n1").name == "odd"


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=8))
def test_exactly_the_single_waiting_pod_is_ever_named(shape: list[tuple[bool, bool]]) -> None:
    """Each pod: (asks for a GPU, already holds one). The answer is the one pod asking and holding nothing."""
    pods, rows = [], []
    for i, (asks, holds) in enumerate(shape):
        p = pod(f"p{i}", ctr("main", "1" if asks else None))
        pods.append(p)
        rows.append(listed(f"p{i}", main=("d",) if holds else ()))
    waiting = [f"p{i}" for i, (asks, holds) in enumerate(shape) if asks and not holds]
    if len(waiting) == 1:
        assert admitting(rows, by_key(*pods), GPU, "n1").name == waiting[0]
    else:
        with pytest.raises(NotFound):
            admitting(rows, by_key(*pods), GPU, "n1")
