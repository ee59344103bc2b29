"""Per-pod preferences and scoring weights (hami-protocol §2.9, §8 case 22)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_common.annotations.keys import (
    DEVICE_CORDON,
    DEVICE_SCORING_WEIGHTS,
    GPU_SCHEDULER_POLICY,
    NODE_SCHEDULER_POLICY,
    NOUSE_GPUUUID,
    NUMA_BIND,
    USE_GPUTYPE,
)
from hami_common.errors import InvalidInput
from hami_common.scheduling import (
    NodePolicy,
    SchedulerDefaults,
    ScoringWeights,
    cordoned_devices,
    parse_scoring_weights,
    preferences_from_annotations,
)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        pytest.param("slot=1,core=2,memory=3", ScoringWeights(1, 2, 3), id="ordered weights parse"),
        pytest.param(" memory = 3, slot = 1, core = 0 ", ScoringWeights(1, 0, 3), id="any order and spaces parse"),
    ],
)
def test_scoring_weights_parse(value: str, want: ScoringWeights) -> None:
    assert parse_scoring_weights(value) == want


@pytest.mark.parametrize(
    ("value", "error"),
    [
        pytest.param("", "expected slot, core, and memory weights", id="empty is refused"),
        pytest.param("slot=1,memory=3", "expected slot, core, and memory weights", id="a missing key is refused"),
        pytest.param("slot=1,core,memory=3", "expected key=value entries", id="an entry without = is refused"),
        pytest.param("slot=1,core=high,memory=3", '"core" weight must be an integer', id="a word is refused"),
        pytest.param("slot=1,core=-1,memory=3", '"core" weight must not be negative', id="a negative is refused"),
        pytest.param("slot=1,bandwidth=2,memory=3", 'unknown weight "bandwidth"', id="an unknown key is refused"),
        pytest.param("slot=1,slot=2,memory=3", 'duplicate "slot" weight', id="a duplicate key is refused"),
        pytest.param("slot=0,core=0,memory=0", "at least one weight must be positive", id="all zero is refused"),
    ],
)
def test_scoring_weights_errors_carry_hamis_text(value: str, error: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_scoring_weights(value)
    assert error in str(caught.value)
    assert str(caught.value).startswith(f'invalid {DEVICE_SCORING_WEIGHTS} annotation "')


@given(st.text(max_size=40))
def test_scoring_weights_never_fail_with_anything_but_invalid_input(value: str) -> None:
    try:
        weights = parse_scoring_weights(value)
    except InvalidInput:
        return
    assert min(weights.slot, weights.core, weights.memory) >= 0


def test_preferences_read_every_user_annotation() -> None:
    prefs = preferences_from_annotations(
        {
            NODE_SCHEDULER_POLICY: "spread",
            GPU_SCHEDULER_POLICY: "binpack,numa",
            DEVICE_SCORING_WEIGHTS: "slot=0,core=1,memory=1",
            USE_GPUTYPE: "A100, H100",
            NOUSE_GPUUUID: " ",
            NUMA_BIND: "true",
        },
        "team-a",
    )
    assert prefs.node_policy is NodePolicy.SPREAD
    assert (prefs.gpu_policy, prefs.weights, prefs.use_types) == (
        "binpack,numa",
        ScoringWeights(0, 1, 1),
        ("A100", "H100"),
    )
    assert (prefs.nouse_uuids, prefs.numa_bind, prefs.namespace) == ((), True, "team-a")


def test_preferences_fall_back_to_the_scheduler_defaults() -> None:
    prefs = preferences_from_annotations(
        {NUMA_BIND: "yes"}, "ns", SchedulerDefaults(node_policy="spread", gpu_policy="mutex")
    )
    assert (prefs.node_policy, prefs.gpu_policy, prefs.numa_bind) == (NodePolicy.SPREAD, "mutex", False)


def test_device_cordon_lists_trimmed_uuids() -> None:
    assert cordoned_devices({DEVICE_CORDON: "dev-1, "}) == frozenset({"dev-1"})
