"""Usage from cache files: figures per container and device, bad files skipped, vanished pods cleaned up."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hami_common import subjects
from hami_common.events import DeviceSample, UsageSample
from hami_common.inventory import FakeInventory
from hami_common.kube import KubeClient
from hami_common.sharedcache import read_shared_cache
from hami_nodeagent.pods import PodIndex, node_pod_cache
from hami_nodeagent.usage import UsageMonitor, parse_dir_name
from hami_sim.sharedcache_writer import CacheSpec, Memory, ProcSpec, build_cache, write_cache
from hami_sim.waiting import eventually
from tests.nodeagent.conftest import NODE, UUID_A, UUID_B, create_pod, delete_pod
from tests.nodeagent.test_registration import Recorder

MIB = 1024 * 1024
CACHE = CacheSpec(
    uuids=(UUID_A,),
    limits=(3000 * MIB,),
    sm_limits=(30,),
    procs=(ProcSpec(pid=7, memory={0: Memory(context=100 * MIB, data=400 * MIB)}, sm_util={0: 25}),),
    recent_kernel=2,
    utilization_switch=1,
    priority=1,
    last_kernel_time=1_780_000_000,
)


@pytest.fixture
async def pods(kube: KubeClient, node: str) -> AsyncIterator[PodIndex]:
    index = PodIndex(node_pod_cache(kube, node))
    task = asyncio.create_task(index.cache.run())
    await index.cache.synced.wait()
    yield index
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _monitor(root: Path, inventory_file: Path, pods: PodIndex, publisher: Recorder, **kw: object) -> UsageMonitor:
    return UsageMonitor(
        node=NODE,
        root=root,
        inventory=FakeInventory(inventory_file, NODE),
        pods=pods,
        publisher=publisher,
        **kw,  # type: ignore[arg-type]
    )


def _reports(publisher: Recorder) -> list[UsageSample]:
    return [e for _, e in publisher.sent if isinstance(e, UsageSample)]


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("0d8c-uid_main", ("0d8c-uid", "main")),
        ("uid_with_under_scores", ("uid", "with_under_scores")),
        ("nounderscore", None),
        ("_main", None),
        ("uid_", None),
    ],
)
def test_cache_directory_names_split_on_the_first_underscore(name: str, parsed: tuple[str, str] | None) -> None:
    assert parse_dir_name(name) == parsed


async def test_cache_file_figures_are_published_per_container_and_device(
    kube: KubeClient, pods: PodIndex, tmp_path: Path, inventory_file: Path
) -> None:
    uid = await create_pod(kube, "trainer", containers=("main", "side"))
    await eventually(lambda: pods.get(uid), what="pod in the watch")
    two = dataclasses.replace(CACHE, uuids=(UUID_A, UUID_B), limits=(3000 * MIB, 0), sm_limits=(30, 100))
    write_cache(tmp_path / f"{uid}_main" / "f3e1.cache", two)
    (tmp_path / f"{uid}_side").mkdir()  # started, no file yet: nothing to report
    publisher = Recorder()
    await _monitor(tmp_path, inventory_file, pods, publisher).scan()
    first, second = _reports(publisher)
    assert (first.namespace, first.pod, first.container, first.pod_uid) == ("default", "trainer", "main", uid)
    assert (first.device_uuid, first.used_bytes, first.limit_bytes) == (UUID_A, 500 * MIB, 3000 * MIB)
    assert (first.sm_util_percent, first.core_limit_percent, first.priority) == (25, 30, 1)
    assert (first.vdevice_index, first.context_bytes, first.buffer_bytes) == (0, 100 * MIB, 400 * MIB)
    assert first.last_kernel_at_s == 1_780_000_000
    assert (second.device_uuid, second.vdevice_index, second.used_bytes, second.limit_bytes) == (UUID_B, 1, 0, 0)
    devices = [e for s, e in publisher.sent if isinstance(e, DeviceSample) and s == subjects.usage(NODE)]
    assert [(d.device_uuid, d.memory_used_bytes, d.utilization_percent) for d in devices] == [
        (UUID_A, 2048 * MIB, 40),
        (UUID_B, 0, 0),
    ]


async def test_bad_files_are_skipped_with_one_log_line_each_and_the_scan_goes_on(
    kube: KubeClient, pods: PodIndex, tmp_path: Path, inventory_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uid = await create_pod(kube, "mixed", containers=("a", "b", "c", "d"))
    await eventually(lambda: pods.get(uid), what="pod in the watch")
    good = build_cache(CACHE)
    (tmp_path / f"{uid}_a").mkdir()
    (tmp_path / f"{uid}_a" / "x.cache").write_bytes(good[:70_000])  # truncated
    (tmp_path / f"{uid}_b").mkdir()
    (tmp_path / f"{uid}_b" / "x.cache").write_bytes(good + bytes(3 * MIB))  # oversized
    (tmp_path / f"{uid}_c").mkdir()
    (tmp_path / f"{uid}_c" / "x.cache").write_bytes(bytes(4) + good[4:])  # no magic
    write_cache(tmp_path / f"{uid}_d" / "x.cache", CACHE)
    publisher = Recorder()
    monitor = _monitor(tmp_path, inventory_file, pods, publisher)
    with caplog.at_level(logging.WARNING, logger="hami_nodeagent.usage"):
        await monitor.scan()
        lines = [r.getMessage() for r in caplog.records if r.name == "hami_nodeagent.usage"]
        assert len(lines) == 3
        assert [w for w in ("truncated", "oversized", "magic") if any(w in line for line in lines)] == [
            "truncated", "oversized", "magic",
        ]  # fmt: skip
        assert [r.container for r in _reports(publisher)] == ["d"]
        caplog.clear()
        await monitor.scan()  # the same problems again: no new lines, the good file still reported
        assert [r for r in caplog.records if r.name == "hami_nodeagent.usage"] == []
    assert [r.container for r in _reports(publisher)] == ["d", "d"]
    assert monitor.skipped == 6


async def test_cache_directories_of_vanished_pods_are_removed_after_the_grace(
    kube: KubeClient, pods: PodIndex, tmp_path: Path, inventory_file: Path
) -> None:
    root = tmp_path / "containers"
    uid = await create_pod(kube, "alive")
    gone_uid = await create_pod(kube, "leaving")
    await eventually(lambda: pods.get(uid) and pods.get(gone_uid), what="pods in the watch")
    live = write_cache(root / f"{uid}_main" / "x.cache", CACHE).parent
    leaving = write_cache(root / f"{gone_uid}_main" / "x.cache", CACHE).parent
    never = write_cache(root / "never-seen-uid_main" / "x.cache", CACHE).parent
    young = write_cache(root / "young-uid_main" / "x.cache", CACHE).parent
    limits = tmp_path / "limits"
    limits.mkdir()
    for name in (live.name, leaving.name, never.name):
        (limits / name).write_text("CUDA_DEVICE_SM_LIMIT=30\n")
    for old in (live, leaving, never, limits / live.name, limits / leaving.name, limits / never.name):
        os.utime(old, (1_000_000, 1_000_000))
    await delete_pod(kube, "leaving")
    await eventually(lambda: pods.ended(gone_uid), what="deletion seen")
    await _monitor(root, inventory_file, pods, Recorder(), dir_grace=60.0, limits_root=limits).scan()
    assert sorted(os.listdir(root)) == sorted([live.name, young.name])
    assert os.listdir(limits) == [live.name]


async def test_feedback_is_written_back_into_the_cache_files(
    kube: KubeClient, pods: PodIndex, tmp_path: Path, inventory_file: Path
) -> None:
    hi_uid = await create_pod(kube, "urgent")
    lo_uid = await create_pod(kube, "batch")
    await eventually(lambda: pods.get(hi_uid) and pods.get(lo_uid), what="pods in the watch")
    root, limits = tmp_path / "containers", _limits_dir(tmp_path, {f"{hi_uid}_main": 0, f"{lo_uid}_main": 1})
    hi = write_cache(root / f"{hi_uid}_main" / "x.cache", dataclasses.replace(CACHE, priority=0))
    lo = write_cache(root / f"{lo_uid}_main" / "x.cache", dataclasses.replace(CACHE, priority=1))
    await _monitor(root, inventory_file, pods, Recorder(), limits_root=limits).scan()
    urgent, batch = read_shared_cache(hi), read_shared_cache(lo)
    assert (urgent.recent_kernel, urgent.utilization_switch) == (1, 0)
    assert (batch.recent_kernel, batch.utilization_switch) == (-1, 1)
    await _monitor(root, inventory_file, pods, Recorder(), feedback=False, limits_root=limits).scan()
    assert read_shared_cache(hi).recent_kernel == 1  # feedback off: nothing written


def _limits_dir(tmp_path: Path, priorities: dict[str, int]) -> Path:
    """The containers' read-only limits files as staging writes them, with their allocated priorities."""
    limits = tmp_path / "limits"
    limits.mkdir()
    for slot, priority in priorities.items():
        (limits / slot).write_text(f"CUDA_DEVICE_SM_LIMIT=30\nCUDA_TASK_PRIORITY={priority}\n")
    return limits


@pytest.mark.parametrize(
    ("claimed", "allocated", "neighbour_blocked"),
    [
        pytest.param(0, 1, False, id="a container claiming high priority in its cache file is treated as allocated"),
        pytest.param(1, 0, True, id="a container allocated high priority keeps it whatever its cache file says"),
    ],
)
async def test_feedback_takes_priority_from_the_allocation_never_from_the_cache_file(
    kube: KubeClient, pods: PodIndex, tmp_path: Path, inventory_file: Path, claimed: int, allocated: int,
    neighbour_blocked: bool,
) -> None:  # fmt: skip
    claimant_uid = await create_pod(kube, "claimant")
    neighbour_uid = await create_pod(kube, "neighbour")
    await eventually(lambda: pods.get(claimant_uid) and pods.get(neighbour_uid), what="pods in the watch")
    root = tmp_path / "containers"
    limits = _limits_dir(tmp_path, {f"{claimant_uid}_main": allocated, f"{neighbour_uid}_main": 1})
    # The claimant's process ran with CUDA_TASK_PRIORITY=<claimed> in its env (or rewrote its own cache file).
    write_cache(root / f"{claimant_uid}_main" / "x.cache", dataclasses.replace(CACHE, priority=claimed))
    neighbour = write_cache(root / f"{neighbour_uid}_main" / "x.cache", dataclasses.replace(CACHE, priority=1))
    publisher = Recorder()
    await _monitor(root, inventory_file, pods, publisher, limits_root=limits).scan()
    assert (read_shared_cache(neighbour).recent_kernel == -1) is neighbour_blocked
    reported = {r.pod: r.priority for r in _reports(publisher)}
    assert reported == {"claimant": allocated, "neighbour": 1}


async def test_fifo_and_symlink_cache_files_are_skipped_and_the_other_containers_still_reported(
    kube: KubeClient, pods: PodIndex, tmp_path: Path, inventory_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uid = await create_pod(kube, "hostile", containers=("fifo", "link", "good"))
    await eventually(lambda: pods.get(uid), what="pod in the watch")
    root = tmp_path / "containers"
    (root / f"{uid}_fifo").mkdir(parents=True)
    fifo = root / f"{uid}_fifo" / "0.cache"
    os.mkfifo(fifo)  # no writer: a blocking open would wait for ever
    outside = write_cache(tmp_path / "elsewhere" / "victim.cache", CACHE)  # a live file the tenant cannot reach
    before = outside.read_bytes()
    (root / f"{uid}_link").mkdir()
    (root / f"{uid}_link" / "0.cache").symlink_to(outside)
    write_cache(root / f"{uid}_good" / "0.cache", CACHE)
    publisher = Recorder()
    monitor = _monitor(root, inventory_file, pods, publisher)
    try:
        with caplog.at_level(logging.WARNING, logger="hami_nodeagent.usage"):
            async with asyncio.timeout(30):  # a deadline for the old, blocking open, not a timing assertion
                await monitor.scan()
                lines = [r.getMessage() for r in caplog.records if r.name == "hami_nodeagent.usage"]
                caplog.clear()
                await monitor.scan()  # the same entries again: no new lines, the good file still reported
                again = [r.getMessage() for r in caplog.records if r.name == "hami_nodeagent.usage"]
    finally:
        _release_fifo_reader(fifo)
    assert len(lines) == 2
    assert any("FIFO" in line for line in lines)
    assert any("symbolic link" in line for line in lines)
    assert again == []
    assert [r.container for r in _reports(publisher)] == ["good", "good"]
    assert outside.read_bytes() == before  # no feedback written through the link


async def test_feedback_is_never_written_through_a_symlinked_cache_file(
    kube: KubeClient, pods: PodIndex, tmp_path: Path, inventory_file: Path
) -> None:
    uid = await create_pod(kube, "pointer", containers=("link", "good"))
    await eventually(lambda: pods.get(uid), what="pod in the watch")
    root = tmp_path / "containers"
    outside = write_cache(tmp_path / "elsewhere" / "victim.cache", CACHE)  # recent_kernel 2: feedback would write
    before = outside.read_bytes()
    (root / f"{uid}_link").mkdir(parents=True)
    (root / f"{uid}_link" / "0.cache").symlink_to(outside)
    good = write_cache(root / f"{uid}_good" / "0.cache", CACHE)
    publisher = Recorder()
    await _monitor(root, inventory_file, pods, publisher).scan()
    assert outside.read_bytes() == before
    assert [r.container for r in _reports(publisher)] == ["good"]
    assert read_shared_cache(good).recent_kernel == 1  # the real file still gets its feedback


async def test_fifo_named_like_a_cache_file_does_not_hide_the_real_one(
    kube: KubeClient, pods: PodIndex, tmp_path: Path, inventory_file: Path
) -> None:
    uid = await create_pod(kube, "decoy")
    await eventually(lambda: pods.get(uid), what="pod in the watch")
    real = write_cache(tmp_path / f"{uid}_main" / "1.cache", CACHE)
    os.mkfifo(real.with_name("0.cache"))
    publisher = Recorder()
    try:
        async with asyncio.timeout(30):  # a deadline for the old, blocking open, not a timing assertion
            await _monitor(tmp_path, inventory_file, pods, publisher).scan()
    finally:
        _release_fifo_reader(real.with_name("0.cache"))
    assert [(r.container, r.used_bytes) for r in _reports(publisher)] == [("main", 500 * MIB)]


def _release_fifo_reader(fifo: Path) -> None:
    """Open the FIFO's write end without blocking, so a reader stuck in open() (the old code) returns."""
    with contextlib.suppress(OSError):  # ENXIO: nobody is reading, as it should be
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
