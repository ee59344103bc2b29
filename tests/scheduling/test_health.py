"""HAMi's CheckHealth with the NVIDIA wrapper (hami-protocol §2.4), as a table of behaviours."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hami_common.annotations import encode_handshake
from hami_common.scheduling import NodeHealth, NodeReport, allocatable_gpus, node_health

NOW = datetime(2026, 8, 21, 8, 20, 39, tzinfo=UTC)
FRESH = encode_handshake(NOW - timedelta(seconds=30))
STALE = encode_handshake(NOW - timedelta(seconds=61))
REG = '[{"id":"GPU-a","count":10,"devmem":8000,"devcore":100,"type":"NVIDIA-A100","health":true}]'


@pytest.mark.parametrize(
    ("handshake", "register", "allocatable", "previous", "expected"),
    [
        pytest.param(
            None,
            REG,
            0,
            NodeReport(),
            NodeHealth(True, True, True, NodeReport(0, REG)),
            id="an absent handshake is written and the cards are read",
        ),
        pytest.param(
            "Reported 2026-08-21 08:00:00",
            REG,
            0,
            NodeReport(),
            NodeHealth(True, True, True, NodeReport(0, REG)),
            id="a foreign handshake value is overwritten",
        ),
        pytest.param(
            FRESH,
            REG,
            0,
            NodeReport(0, REG),
            NodeHealth(True, False, False, NodeReport(0, REG)),
            id="a handshake younger than a minute is healthy without GPUs allocatable",
        ),
        pytest.param(
            STALE,
            REG,
            0,
            NodeReport(0, REG),
            NodeHealth(False, False, False, NodeReport(0, REG)),
            id="a stale handshake without GPUs allocatable is unhealthy",
        ),
        pytest.param(
            "Requesting_yesterday",
            REG,
            0,
            NodeReport(0, REG),
            NodeHealth(True, False, False, NodeReport(0, REG)),
            id="an unparseable Requesting stamp counts as fresh",
        ),
        pytest.param(
            "Requesting",
            REG,
            0,
            NodeReport(0, REG),
            NodeHealth(True, False, False, NodeReport(0, REG)),
            id="a Requesting value without a stamp counts as fresh",
        ),
        pytest.param(
            STALE,
            REG,
            8,
            NodeReport(8, REG),
            NodeHealth(True, False, False, NodeReport(8, REG)),
            id="allocatable GPUs keep a node with a stale handshake healthy",
        ),
        pytest.param(
            FRESH,
            REG,
            0,
            NodeReport(8, REG),
            NodeHealth(False, False, False, NodeReport()),
            id="GPUs gone from allocatable after a report make the node unhealthy and forget the report",
        ),
        pytest.param(
            STALE,
            REG,
            16,
            NodeReport(8, REG),
            NodeHealth(True, False, True, NodeReport(16, REG)),
            id="a changed allocatable count is healthy and rereads the cards",
        ),
        pytest.param(
            None,
            REG,
            8,
            NodeReport(),
            NodeHealth(True, True, True, NodeReport(8, REG)),
            id="a new node with GPUs allocatable is written and read",
        ),
        pytest.param(
            FRESH,
            REG,
            8,
            NodeReport(8, "[]"),
            NodeHealth(True, False, True, NodeReport(8, REG)),
            id="a changed registration text rereads the cards",
        ),
    ],
)
def test_node_health(
    handshake: str | None, register: str, allocatable: int, previous: NodeReport, expected: NodeHealth
) -> None:
    assert node_health(handshake, register, allocatable, previous, NOW) == expected


@pytest.mark.parametrize(
    ("allocatable", "count"),
    [
        pytest.param({"nvidia.com/gpu": "8"}, 8, id="a plain count"),
        pytest.param({}, 0, id="no GPUs listed counts as none"),
        pytest.param({"nvidia.com/gpu": "many"}, 0, id="an unreadable quantity counts as none"),
        pytest.param({"nvidia.com/gpu": "1500m"}, 2, id="a fractional quantity rounds up as Quantity.Value does"),
    ],
)
def test_allocatable_gpus(allocatable: dict[str, str], count: int) -> None:
    assert allocatable_gpus(allocatable, "nvidia.com/gpu") == count
