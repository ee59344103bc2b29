"""The slot's hostpid, which HAMi's monitor maps a container's processes by (HAMi-core sets it at cuInit).

It must be there when cuInit returns where NVML already lists the process, else when the process's first
context is created, and at the latest when its first kernel launch returns: in every run, not once the
sampler thread gets round to it (issue 28 item 10: 0 after cuInit in 9 of 10 runs). The probe reads its
own slot right after each call returns. nvmlInit is slowed to a real one's pace, which is what let the
sampler lose the race.
"""

from __future__ import annotations

import pytest

from tests.native._probe import Probe, Record

RUNS = 5  # per build variant: a race lost in some runs fails one of them
SLOW_NVML = {"VGPU_STUB_NVML_INIT_US": "30000"}
LISTED_WITH_CONTEXT = {**SLOW_NVML, "VGPU_STUB_LIST_AFTER_CONTEXT": "1"}  # a real driver's behaviour
OFFSET = 100000  # VGPU_STUB_PID_OFFSET: NVML reports pid + OFFSET, as from outside a PID namespace


def _hostpids(records: list[Record]) -> list[int]:
    return [r.num("hostpid") for r in records]


@pytest.mark.parametrize("run", range(RUNS))
def test_hostpid_is_set_when_cuinit_returns_where_nvml_lists_the_process(probe: Probe, run: int) -> None:
    result = probe.run("cuinit", "hostpid", env=SLOW_NVML)
    assert result.one("cuinit").rc == 0
    assert _hostpids(result.of("hostpid")) == [result.one("hostpid").num("pid")]


@pytest.mark.parametrize("run", range(RUNS))
@pytest.mark.parametrize("offset", [0, OFFSET], ids=["same-pid", "pid-namespace"])
def test_hostpid_is_set_when_the_first_context_is_created(probe: Probe, run: int, offset: int) -> None:
    # listed only with a context: nothing tells at cuInit; the context's creation does
    env = {**LISTED_WITH_CONTEXT, "VGPU_STUB_PID_OFFSET": str(offset)}
    result = probe.run("cuinit", "device:0", "hostpid", "launch:1:1", "hostpid", env=env)
    pid = result.of("hostpid")[0].num("pid")
    assert _hostpids(result.of("hostpid")) == [pid + offset, pid + offset]


@pytest.mark.parametrize("run", range(RUNS))
def test_hostpid_is_set_when_the_first_launch_returns(probe: Probe, run: int) -> None:
    # context charging off: no NVML listing around context creation, so the first launch looks once
    env = {**LISTED_WITH_CONTEXT, "VGPU_CONTEXT_MEMORY": "ignore"}
    result = probe.run("init", "launch:1:1", "hostpid", "launch:1:1", env=env)
    assert [r.rc for r in result.of("launch")] == [0, 0]
    assert _hostpids(result.of("hostpid")) == [result.one("hostpid").num("pid")]


def test_a_fork_child_learns_its_own_hostpid_not_its_parents(probe: Probe) -> None:
    result = probe.run("cuinit", "hostpid", "forkinit", "forkinit", env=SLOW_NVML)
    parent = result.one("hostpid").num("pid")
    children = result.of("forkinit")
    assert [c.rc for c in children] == [0, 0]
    assert [c.num("hostpid") for c in children] == [c.num("pid") for c in children]
    assert parent not in [c.num("pid") for c in children]
