"""The node-local staging store, both sides (ARCHITECTURE §3, "The node-local staging store")."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_common.allocation import ContainerGrant, GrantedDevice, NodeAllocationConfig, PodGrant, build_pod
from hami_common.staging import StagedPod, StagingStore, entry_name, write_host_files


def staged(uid: str, bind: int, *counts: int, config: NodeAllocationConfig | None = None) -> StagedPod:
    containers = tuple(
        ContainerGrant(name=f"c{i}", devices=tuple(GrantedDevice(f"GPU-{uid}-{j}", 100, 10) for j in range(n)))
        for i, n in enumerate(counts)
    )
    answers = build_pod(
        PodGrant(pod_uid=uid, namespace="ns", name=f"pod-{uid}", containers=containers),
        config or NodeAllocationConfig(),
    )
    return StagedPod(pod_uid=uid, namespace="ns", name=f"pod-{uid}", node="n1", bind_time_ns=bind, containers=answers)


def test_entries_sort_by_bind_time_whatever_the_number_of_digits() -> None:
    assert entry_name(9, "b") < entry_name(10, "a")


def test_oldest_matching_pod_is_served_first(tmp_path: Path) -> None:
    store = StagingStore(tmp_path)
    assert store.put(staged("new", 200, 1))
    assert store.put(staged("old", 100, 1))
    first = store.claim(1).claim
    second = store.claim(1).claim
    assert first is not None
    assert second is not None
    assert (first.pod.pod_uid, second.pod.pod_uid) == ("old", "new")
    assert store.claim(1).claim is None


def test_a_pod_whose_next_container_wants_another_count_is_passed_over(tmp_path: Path) -> None:
    store = StagingStore(tmp_path)
    store.put(staged("two", 100, 2))
    store.put(staged("one", 200, 1))
    got = store.claim(1).claim
    assert got is not None
    assert got.pod.pod_uid == "one"
    assert store.staged_uids() == ["two"]


def test_containers_are_served_in_order_then_the_entry_moves_aside(tmp_path: Path) -> None:
    store = StagingStore(tmp_path)
    store.put(staged("p", 100, 1, 2))
    first = store.claim(1).claim
    assert first is not None
    assert (first.container.name, first.complete) == ("c0", False)
    assert store.claim(1).claim is None  # the next container wants two
    second = store.claim(2).claim
    assert second is not None
    assert (second.container.name, second.complete) == ("c1", True)
    assert store.staged_uids() == []
    assert (tmp_path / "done" / entry_name(100, "p")).is_file()


def test_staging_the_same_pod_twice_is_a_no_op_even_after_serving(tmp_path: Path) -> None:
    store = StagingStore(tmp_path)
    assert store.put(staged("p", 100, 1))
    assert not store.put(staged("p", 100, 1))
    store.claim(1)
    assert not store.put(staged("p", 100, 1))
    assert store.claim(1).claim is None


def test_a_pod_known_gone_is_never_served(tmp_path: Path) -> None:
    store = StagingStore(tmp_path)
    store.put(staged("gone", 100, 1))
    store.put(staged("alive", 200, 1))
    got = store.claim(1, gone={"gone"}).claim
    assert got is not None
    assert got.pod.pod_uid == "alive"
    assert store.claim(1).claim is None  # set aside for good, not merely skipped


def test_removed_entries_are_not_served(tmp_path: Path) -> None:
    store = StagingStore(tmp_path)
    store.put(staged("p", 100, 1))
    assert store.remove("p")
    assert store.claim(1).claim is None


def test_missing_directory_means_nothing_staged(tmp_path: Path) -> None:
    store = StagingStore(tmp_path / "absent")
    assert store.claim(1).claim is None
    assert store.peek(1) is None


def test_peek_does_not_serve(tmp_path: Path) -> None:
    store = StagingStore(tmp_path)
    store.put(staged("p", 100, 1))
    peeked = store.peek(1)
    assert peeked is not None
    assert peeked.pod.pod_uid == "p"
    assert store.claim(1).claim is not None


def test_skip_advances_past_a_container_served_by_the_fallback(tmp_path: Path) -> None:
    store = StagingStore(tmp_path)
    store.put(staged("p", 100, 1, 1))
    store.skip("p")
    got = store.claim(1).claim
    assert got is not None
    assert (got.container.name, got.complete) == ("c1", True)


def test_no_temporary_files_are_left_behind(tmp_path: Path) -> None:
    store = StagingStore(tmp_path)
    store.put(staged("p", 100, 1))
    assert sorted(os.listdir(tmp_path)) == [entry_name(100, "p")]


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(max_size=200))
def test_corrupt_entry_is_set_aside_reported_and_the_next_one_served(tmp_path: Path, garbage: bytes) -> None:
    root = tmp_path / os.urandom(4).hex()
    store = StagingStore(root)
    store.put(staged("good", 200, 1))
    (root / entry_name(100, "bad")).write_bytes(garbage)
    outcome = store.claim(1)
    assert outcome.claim is not None
    assert outcome.claim.pod.pod_uid == "good"
    assert len(outcome.problems) == 1
    assert entry_name(100, "bad") in outcome.problems[0]
    assert (root / "corrupt" / entry_name(100, "bad")).exists()


def test_host_files_are_a_world_writable_cache_dir_and_a_read_only_limits_file(tmp_path: Path) -> None:
    pod = staged("p", 100, 1, config=NodeAllocationConfig(hook_path=str(tmp_path / "hook")))
    answer = pod.containers[0]
    write_host_files(answer)
    write_host_files(answer)  # idempotent
    assert stat.S_IMODE(os.stat(answer.cache_dir).st_mode) == 0o777
    assert stat.S_IMODE(os.stat(answer.limits_host_path).st_mode) == 0o444
    assert Path(answer.limits_host_path).read_text() == answer.limits_content
