"""Handshake, node lock, timestamps and topology scores (hami-protocol §2.3, §2.4, §2.7, §2.8, §8 case 6)."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_common.annotations import (
    BIND_TIME,
    MIG_ALLOCATIONS,
    NODE_LOCK,
    NODE_SCORE,
    NodeLock,
    check_handshake,
    decode_mig_allocations,
    decode_node_lock,
    decode_pair_scores,
    decode_rfc3339,
    decode_unix_seconds,
    encode_handshake,
    encode_mig_allocations,
    encode_node_lock,
    encode_pair_scores,
    encode_rfc3339,
    encode_unix_seconds,
)
from hami_common.errors import AnnotationError

CEST = timezone(timedelta(hours=2))
NOW = datetime(2024, 1, 2, 0, 5, 0, tzinfo=CEST)


def test_handshake_value_is_requesting_and_local_time() -> None:
    assert encode_handshake(datetime(2026, 8, 21, 8, 20, 39, tzinfo=CEST)) == "Requesting_2026-08-21 08:20:39"


@pytest.mark.parametrize(
    ("value", "allocatable", "healthy", "need_update"),
    [
        pytest.param("Requesting_2128-12-02 00:00:00", 0, True, False, id="a request in the future is fresh"),
        pytest.param("Requesting", 0, True, False, id="a request without a time counts as fresh"),
        pytest.param("Requesting_not-a-timestamp", 0, True, False, id="an unparseable time counts as fresh"),
        pytest.param("Requesting_2024-01-02 00:00:00", 0, False, False, id="expired with nothing allocatable"),
        pytest.param("Requesting_2024-01-02 00:00:00", 8, True, False, id="expired but GPUs allocatable"),
        pytest.param("Requesting_2024-01-02 00:04:30", 0, True, False, id="within sixty seconds"),
        pytest.param(None, 0, True, True, id="no handshake yet asks for one"),
        pytest.param("Reported_2024-01-02 00:00:00", 0, True, True, id="a pre-2.8 value asks for a new one"),
    ],
)
def test_check_handshake_matches_hamis_check_health(
    value: str | None, allocatable: int, healthy: bool, need_update: bool
) -> None:
    verdict = check_handshake(value, NOW, allocatable)
    assert (verdict.healthy, verdict.need_update) == (healthy, need_update)


def test_node_lock_round_trips_with_holder() -> None:
    lock = NodeLock(locked_at=datetime(2026, 8, 21, 8, 20, 39, tzinfo=CEST), namespace="default", name="gpu-pod")
    assert encode_node_lock(lock) == "2026-08-21T08:20:39+02:00,default,gpu-pod"
    assert decode_node_lock(encode_node_lock(lock)) == lock
    assert decode_node_lock(encode_node_lock(lock)).held_by("default", "gpu-pod")


def test_node_lock_in_utc_uses_z_like_go() -> None:
    lock = NodeLock(locked_at=datetime(2026, 8, 21, 6, 20, 39, tzinfo=UTC), namespace="ns", name="p")
    assert encode_node_lock(lock) == "2026-08-21T06:20:39Z,ns,p"


def test_legacy_node_lock_is_a_bare_time_without_holder() -> None:
    lock = decode_node_lock("2026-08-21T08:20:39+02:00")
    assert (lock.namespace, lock.name) == ("", "")
    assert lock.locked_at == datetime(2026, 8, 21, 8, 20, 39, tzinfo=CEST)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("yesterday,default,pod", id="a time that is not RFC 3339"),
        pytest.param("2026-08-21T08:20:39Z,default", id="a holder without a name"),
        pytest.param("2026-08-21T08:20:39Z,,pod", id="an empty namespace"),
        pytest.param("2026-13-21T08:20:39Z,ns,pod", id="month thirteen"),
        pytest.param("2026-08-21,ns,pod", id="a date without time"),
    ],
)
def test_malformed_node_lock_names_the_annotation(value: str) -> None:
    with pytest.raises(AnnotationError, match=NODE_LOCK):
        decode_node_lock(value)


def test_rfc3339_accepts_go_nanoseconds() -> None:
    moment = decode_rfc3339("2026-08-21T08:20:39.123456789Z", NODE_LOCK)
    assert moment.microsecond == 123456
    assert encode_rfc3339(moment) == "2026-08-21T08:20:39Z"


def test_unix_seconds_round_trip() -> None:
    moment = datetime(2024, 1, 12, 10, 19, 56, tzinfo=UTC)
    assert encode_unix_seconds(moment) == "1705054796"
    assert decode_unix_seconds("1705054796", BIND_TIME) == moment


@pytest.mark.parametrize("value", ["", "-1", "12.5", "1e9", "99999999999999999999"])
def test_malformed_unix_seconds_names_the_annotation(value: str) -> None:
    with pytest.raises(AnnotationError, match=BIND_TIME):
        decode_unix_seconds(value, BIND_TIME)


def test_pair_scores_decode_the_spec_example() -> None:
    value = '[{"uuid":"GPU-a","score":{"GPU-b":600,"GPU-c":20}},{"uuid":"GPU-b","score":{"GPU-a":600,"GPU-c":20}}]'
    scores = decode_pair_scores(value)
    assert scores["GPU-a"]["GPU-b"] == 600
    assert scores["GPU-b"]["GPU-c"] == 20
    assert encode_pair_scores(scores) == value


@pytest.mark.parametrize(
    "value",
    [
        '{"uuid":"a"}',
        '[{"score":{}}]',
        '[{"uuid":"a","score":{"b":"x"}}]',
        '[{"uuid":"a"},{"uuid":"a"}]',
        "nope",
    ],
)
def test_malformed_pair_scores_name_the_annotation(value: str) -> None:
    with pytest.raises(AnnotationError, match=NODE_SCORE):
        decode_pair_scores(value)


@given(st.text(max_size=80))
def test_node_lock_decoder_never_raises_anything_but_annotation_error(value: str) -> None:
    with contextlib.suppress(AnnotationError):
        decode_node_lock(value)


# --- MIG reservations (hami-protocol §2.6) -------------------------------------------------------------
MIG_EXAMPLE = (
    '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-x","profile":"1g.10gb","placement":{"start":6,"size":1}}]'
)


def test_mig_allocation_example_decodes_and_reencodes_exactly() -> None:
    (entry,) = decode_mig_allocations(MIG_EXAMPLE)
    assert (entry.gpu_uuid, entry.profile, entry.placement.start, entry.placement.size) == ("GPU-x", "1g.10gb", 6, 1)
    assert not entry.realised
    assert encode_mig_allocations([entry]) == MIG_EXAMPLE


def test_mig_allocation_with_runtime_ids_is_realised() -> None:
    value = MIG_EXAMPLE.replace('"size":1}', '"size":1},"migUUID":"MIG-1","gpuInstanceID":3,"computeInstanceID":0')
    (entry,) = decode_mig_allocations(value)
    assert entry.realised
    assert (entry.mig_uuid, entry.gpu_instance_id, entry.compute_instance_id) == ("MIG-1", 3, 0)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(MIG_EXAMPLE.replace('"size":1}', '"size":1},"migUUID":"MIG-1"'), id="runtime ids come together"),
        pytest.param(MIG_EXAMPLE.replace('"containerIndex":0', '"containerIndex":-1'), id="negative index"),
        pytest.param('[{"containerIndex":0}]', id="missing fields"),
        pytest.param("[", id="truncated"),
    ],
)
def test_malformed_mig_allocations_name_the_annotation(value: str) -> None:
    with pytest.raises(AnnotationError, match=MIG_ALLOCATIONS):
        decode_mig_allocations(value)
