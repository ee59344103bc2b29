"""Usage from the containers' shared-cache files, as HAMi's vGPU monitor reads them (vgpu-interposer §5, §6).

Every ``interval`` the monitor lists ``<hook>/vgpu/containers/<podUID>_<container>/``, reads the ``*.cache``
file of each with :func:`hami_common.sharedcache.read_shared_cache`, and publishes on ``hami.usage.<node>``:

* one :class:`UsageSample` per container and device (pods this node's watch knows);
* one :class:`DeviceSample` per GPU with the inventory's host-wide figures.

A file that is truncated, oversized or corrupt, or is no regular file at all (a FIFO, a symbolic link: the
folders are the tenants'), is skipped with one log line (again only when its problem changes) and the scan
goes on; such a file is never followed, waited on or written into. The directory of a pod that is gone is
removed once it is older than ``dir_grace`` (HAMi waits 5 minutes), and so is the pod's limits file under
``limits_root``. With ``feedback`` on, the priority feedback of :mod:`.feedback` is written back into the files.

A container's priority is the one its allocation gave it: ``CUDA_TASK_PRIORITY`` of its read-only limits
file (``<limits_root>/<podUID>_<container>``, written from the placement), else the default 1. The cache
file's ``priority`` field is the container's to write, so it decides nothing here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from hami_common import logkeys, subjects
from hami_common.allocation import DEFAULT_TASK_PRIORITY, task_priority
from hami_common.errors import HamiError, InvalidInput
from hami_common.events import DeviceSample, UsageSample
from hami_common.inventory import GpuInventory
from hami_common.sharedcache import SharedCache, open_regular, read_shared_cache, write_feedback
from hami_nodeagent.feedback import FeedbackInput, plan_feedback
from hami_nodeagent.pods import PodIndex
from hami_nodeagent.registration import Publisher

__all__ = [
    "CACHE_SUFFIX",
    "CacheDir",
    "UsageMonitor",
    "allocated_priority",
    "find_cache_file",
    "parse_dir_name",
    "scan_containers",
]

log = logging.getLogger(__name__)

CACHE_SUFFIX: Final = ".cache"
LIBRARY_NAME: Final = "libvgpu.so"  # HAMi mounts the library into the same directory
UUID_LABEL_CHARS: Final = 40  # HAMi labels a device by the first 40 characters of the file's UUID
MAX_LIMITS_FILE: Final = 64 * 1024  # the allocator writes a few hundred bytes


def parse_dir_name(name: str) -> tuple[str, str] | None:
    """``<podUID>_<container>`` split on the first ``_``; None for names of another form."""
    uid, sep, container = name.partition("_")
    return (uid, container) if sep and uid and container else None


def find_cache_file(directory: Path) -> Path | None:
    """The first ``*.cache`` regular file (by name) of a container directory; None before the container
    starts. A FIFO or link of that name does not hide a real file behind it; with no regular file, the first
    other entry is returned, so reading it reports the problem."""
    try:
        entries = sorted(
            (e for e in os.scandir(directory) if e.name.endswith(CACHE_SUFFIX) and LIBRARY_NAME not in e.name
             and e.name[0] != "."),
            key=lambda e: e.name,
        )  # fmt: skip
        regular = [e for e in entries if e.is_file(follow_symlinks=False)]
    except OSError:
        return None
    chosen = (regular or entries)[:1]
    return Path(chosen[0].path) if chosen else None


def allocated_priority(limits_file: Path) -> int:
    """``CUDA_TASK_PRIORITY`` of a container's limits file; the default when there is none (blocking)."""
    try:
        fd, _ = open_regular(limits_file, os.O_RDONLY)
    except (InvalidInput, OSError):
        return DEFAULT_TASK_PRIORITY
    try:
        data = os.read(fd, MAX_LIMITS_FILE)
    except OSError:
        return DEFAULT_TASK_PRIORITY
    finally:
        os.close(fd)
    return task_priority(data.decode("utf-8", "replace"))


@dataclass(frozen=True, slots=True)
class CacheDir:
    """One container directory as a scan found it: its file decoded, or the reason it was skipped."""

    path: Path
    pod_uid: str
    container: str
    modified_s: float
    file: Path | None = None
    cache: SharedCache | None = None
    problem: str = ""


def scan_containers(root: Path) -> list[CacheDir]:
    """Read every container directory under ``root`` (blocking; a missing root is an empty node)."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return []
    found: list[CacheDir] = []
    for entry in entries:
        parsed = parse_dir_name(entry.name)
        if parsed is None or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            modified = entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue  # removed meanwhile
        path = Path(entry.path)
        file = find_cache_file(path)
        if file is None:
            found.append(CacheDir(path, *parsed, modified))
            continue
        try:
            found.append(CacheDir(path, *parsed, modified, file, read_shared_cache(file)))
        except InvalidInput as err:
            found.append(CacheDir(path, *parsed, modified, file, problem=str(err)))
        except OSError as err:
            found.append(CacheDir(path, *parsed, modified, file, problem=f"unreadable: {err.strerror or err}"))
    return found


@dataclass(eq=False)
class UsageMonitor:
    node: str
    root: Path  # <hook>/vgpu/containers
    inventory: GpuInventory
    pods: PodIndex
    publisher: Publisher
    interval: float = 5.0
    dir_grace: float = 300.0
    feedback: bool = True
    limits_root: Path | None = None  # where staging writes the containers' limits files
    clock: Callable[[], int] = time.time_ns
    skipped: int = 0  # files skipped as malformed, over all scans
    published: int = 0
    _reported: dict[Path, str] = field(default_factory=dict)

    async def scan(self) -> list[CacheDir]:
        """One period: read, publish, clean up, feed back. Raises HamiError only for the inventory."""
        dirs = await asyncio.to_thread(scan_containers, self.root)
        now_ns = self.clock()
        self._report_problems(dirs)
        priorities = await asyncio.to_thread(self._priorities, dirs)
        await self._publish_containers(dirs, priorities, now_ns)
        await self._publish_devices(now_ns)
        await asyncio.to_thread(self._remove_vanished, dirs, now_ns / 1e9)
        if self.feedback:
            await asyncio.to_thread(self._feed_back, dirs, priorities)
        return dirs

    def _priorities(self, dirs: Sequence[CacheDir]) -> dict[Path, int]:
        """Each read container's allocated priority, by its directory (blocking)."""
        return {
            d.path: DEFAULT_TASK_PRIORITY if self.limits_root is None else allocated_priority(
                self.limits_root / d.path.name
            )
            for d in dirs
            if d.cache is not None
        }  # fmt: skip

    def _report_problems(self, dirs: Sequence[CacheDir]) -> None:
        seen: dict[Path, str] = {}
        for d in dirs:
            if d.file is None or not d.problem:
                continue
            self.skipped += 1
            seen[d.file] = d.problem
            if self._reported.get(d.file) != d.problem:
                log.warning("skipping cache file %s: %s", d.file, d.problem, extra={logkeys.POD_UID: d.pod_uid})
        self._reported = seen

    async def _publish_containers(self, dirs: Sequence[CacheDir], priorities: Mapping[Path, int], now_ns: int) -> None:
        subject = subjects.usage(self.node)
        for d in dirs:
            pod = self.pods.get(d.pod_uid)
            if d.cache is None or pod is None:
                continue
            cache = d.cache
            for dev in cache.devices:
                if not dev.uuid:
                    continue
                report = UsageSample(
                    node=self.node,
                    pod_uid=d.pod_uid,
                    namespace=pod.metadata.namespace,
                    pod=pod.metadata.name,
                    container=d.container,
                    device_uuid=dev.uuid[:UUID_LABEL_CHARS],
                    used_bytes=dev.used_bytes,
                    limit_bytes=dev.limit_bytes,
                    sm_util_percent=dev.sm_util_percent,
                    core_limit_percent=dev.sm_limit_percent,
                    priority=priorities.get(d.path, DEFAULT_TASK_PRIORITY),
                    at_ns=now_ns,
                    vdevice_index=dev.index,
                    context_bytes=dev.context_bytes,
                    module_bytes=dev.module_bytes,
                    buffer_bytes=dev.buffer_bytes,
                    last_kernel_at_s=None if cache.format == "v0" else cache.last_kernel_time_s,
                )
                await self.publisher.publish(subject, report)
                self.published += 1

    async def _publish_devices(self, now_ns: int) -> None:
        gpus = {g.uuid: g for g in await asyncio.to_thread(self.inventory.gpus)}
        for stat in await asyncio.to_thread(self.inventory.stats):
            gpu = gpus.get(stat.uuid)
            if gpu is None:
                continue
            sample = DeviceSample(
                node=self.node,
                device_uuid=stat.uuid,
                index=gpu.index,
                name=gpu.model,
                memory_used_bytes=stat.memory_used_bytes,
                utilization_percent=stat.utilization_percent,
                memory_utilization_percent=stat.memory_utilization_percent,
                at_ns=now_ns,
            )
            await self.publisher.publish(subjects.usage(self.node), sample)

    def _remove_vanished(self, dirs: Sequence[CacheDir], now_s: float) -> None:
        if not self.pods.synced:
            return  # an empty cache before the first list would look like every pod is gone
        live = self.pods.uids()
        for d in dirs:
            if d.pod_uid in live or now_s - d.modified_s < self.dir_grace:
                continue
            log.info("removing cache directory %s of a pod that is gone", d.path, extra={logkeys.POD_UID: d.pod_uid})
            shutil.rmtree(d.path, ignore_errors=True)
        if self.limits_root is not None:
            self._remove_limits(live, now_s)

    def _remove_limits(self, live: frozenset[str], now_s: float) -> None:
        """Limits files (``<limits>/<podUID>_<container>``, written at staging) of pods that are gone."""
        assert self.limits_root is not None
        try:
            entries = list(os.scandir(self.limits_root))
        except OSError:
            return
        for entry in entries:
            parsed = parse_dir_name(entry.name)
            if parsed is None or parsed[0] in live:
                continue
            try:
                if now_s - entry.stat(follow_symlinks=False).st_mtime >= self.dir_grace:
                    os.unlink(entry.path)
            except OSError:
                continue  # gone meanwhile, or a directory: not ours

    def _feed_back(self, dirs: Sequence[CacheDir], priorities: Mapping[Path, int]) -> None:
        files = {str(d.file): d for d in dirs if d.file is not None and d.cache is not None}
        inputs = [
            FeedbackInput(
                key=key,
                priority=priorities.get(d.path, DEFAULT_TASK_PRIORITY),
                recent_kernel=d.cache.recent_kernel,
                utilization_switch=d.cache.utilization_switch,
                device_uuids=tuple(dev.uuid[:UUID_LABEL_CHARS] for dev in d.cache.devices if dev.uuid),
            )
            for key, d in files.items()
            if d.cache is not None
        ]
        for write in plan_feedback(inputs):
            try:
                write_feedback(
                    write.key, recent_kernel=write.recent_kernel, utilization_switch=write.utilization_switch
                )
            except (InvalidInput, OSError) as err:
                log.info("feedback not written to %s: %s", write.key, err)

    async def run(self) -> None:
        """Scan every ``interval`` until cancelled; a failed period is logged and the next one runs."""
        while True:
            try:
                await self.scan()
            except HamiError as err:
                log.warning("usage scan on %s failed: %s", self.node, err, extra={logkeys.NODE: self.node})
            except Exception:  # the loop's edge: a bug is logged with its traceback, the agent keeps serving
                log.exception("usage scan on %s failed unexpectedly", self.node)
            await asyncio.sleep(self.interval)  # the scan period, not a wait for a condition
