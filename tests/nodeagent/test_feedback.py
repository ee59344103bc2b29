"""The monitor's priority feedback (vgpu-interposer §6), as pure decisions."""

from __future__ import annotations

import pytest

from hami_nodeagent.feedback import FeedbackInput, FeedbackWrite, plan_feedback


def ctr(key: str, priority: int, recent: int, switch: int = 1, gpus: tuple[str, ...] = ("G0",)) -> FeedbackInput:
    return FeedbackInput(key=key, priority=priority, recent_kernel=recent, utilization_switch=switch, device_uuids=gpus)


@pytest.mark.parametrize(
    ("containers", "writes"),
    [
        pytest.param(
            [ctr("a", 1, 2)], [FeedbackWrite("a", 1, 0)],
            id="a lone active container is decremented and not throttled",
        ),
        pytest.param(
            [ctr("a", 1, 2), ctr("b", 1, 2, switch=0)], [FeedbackWrite("a", 1, None), FeedbackWrite("b", 1, 1)],
            id="two active containers of one priority on a GPU are both throttled",
        ),
        pytest.param(
            [ctr("hi", 0, 2), ctr("lo", 1, 2)], [FeedbackWrite("hi", 1, 0), FeedbackWrite("lo", -1, None)],
            id="an active more important neighbour blocks a container",
        ),
        pytest.param(
            [ctr("hi", 0, 1, switch=0), ctr("lo", 1, -1)], [FeedbackWrite("hi", 0, None), FeedbackWrite("lo", 0, 0)],
            id="a blocked container is released when its neighbour stops being active",
        ),
        pytest.param(
            [ctr("hi", 0, 2, gpus=("G1",)), ctr("lo", 1, 2, switch=0)],
            [FeedbackWrite("hi", 1, 0), FeedbackWrite("lo", 1, None)],
            id="a more important container on another GPU does not block",
        ),
        pytest.param(
            [ctr("a", 1, 0, switch=0), ctr("b", 1, 0, switch=0)], [],
            id="idle containers whose fields already agree get no write",
        ),
        pytest.param(
            [ctr("hi", 0, 2, gpus=("",)), ctr("lo", 1, 2, switch=0, gpus=("",))],
            [FeedbackWrite("hi", 1, 0), FeedbackWrite("lo", 1, None)],
            id="devices without a UUID are not shared",
        ),
    ],
)  # fmt: skip
def test_feedback_follows_hamis_monitor(containers: list[FeedbackInput], writes: list[FeedbackWrite]) -> None:
    assert list(plan_feedback(containers)) == writes
