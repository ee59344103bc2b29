"""The node-local staging store: Allocate answers pre-staged by the node agent for the device plugin.

Both sides of one directory (``HAMI_STAGING_DIR``, default ``/var/lib/hami/staging``; ARCHITECTURE §3):

* **writer** (node agent): :meth:`StagingStore.put` writes one :class:`StagedPod` per placed pod, named
  ``<bind-time-ns>-<pod-uid>`` (the time zero-padded to 20 digits, so a plain sort gives bind order), as
  versioned JSON, to a temporary name, fsynced, renamed, directory fsynced. A second ``put`` of the same pod
  (a redelivered placement) is a no-op. :meth:`StagingStore.remove` drops the entry of a deleted pod.
* **reader** (device plugin): :meth:`StagingStore.claim` takes the oldest pod whose next unserved container
  asks for N devices and records that container as served by renaming the file to
  ``<bind-time-ns>-<pod-uid>.<served>`` (one atomic ``rename``, no rewrite). When every container is served
  the file moves to ``done/`` (the newest :data:`DONE_KEEP` are kept for diagnosis). Entries of pods the
  caller knows are gone move to ``gone/`` and are never served; entries that do not decode move to
  ``corrupt/`` and are reported. A missing or unreadable directory means "nothing staged".

:func:`write_host_files` creates what an answer needs on the host (cache directory, limits file); ``put``
does it for every staged container, off the plugin's critical path.

A MIG container's entry is staged without its device list (``ContainerAllocation.pending_mig``): the MIG
UUIDs exist only once the device plugin has created the instances at Allocate, which then completes the
answer (``hami_common.allocation.mig_answer``). It has no host files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Container, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from hami_common import logkeys
from hami_common.allocation import ContainerAllocation

__all__ = [
    "DEFAULT_STAGING_DIR",
    "DONE_KEEP",
    "STAGING_SCHEMA",
    "Claim",
    "ClaimOutcome",
    "StagedPod",
    "StagingStore",
    "entry_name",
    "has_host_files",
    "write_host_files",
]

log = logging.getLogger(__name__)

STAGING_SCHEMA: Final = 1
DEFAULT_STAGING_DIR: Final = "/var/lib/hami/staging"
DONE_KEEP: Final = 256
DONE: Final = "done"
GONE: Final = "gone"
CORRUPT: Final = "corrupt"
_TMP_PREFIX: Final = "."
_SERVED_SEP: Final = "."
_TIME_DIGITS: Final = 20
_MAX_ENTRY_BYTES: Final = 4 << 20


class StagedPod(msgspec.Struct, frozen=True, kw_only=True):
    """One staged pod: who it is, when it was bound, and the answer for each container that has devices."""

    schema: int = STAGING_SCHEMA
    pod_uid: str
    namespace: str
    name: str
    node: str
    bind_time_ns: int
    trace_context: str = ""  # the pod's W3C traceparent, so the Allocate span continues its trace
    containers: tuple[ContainerAllocation, ...]  # HAMi order (init first), only containers with devices


@dataclass(frozen=True, slots=True)
class Claim:
    pod: StagedPod
    index: int  # of the served container in ``pod.containers``
    complete: bool  # every container of the pod has now been served

    @property
    def container(self) -> ContainerAllocation:
        return self.pod.containers[self.index]


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    claim: Claim | None
    problems: tuple[str, ...] = ()  # one sentence per entry set aside as corrupt while looking


@dataclass(frozen=True, slots=True)
class _Entry:
    file: str
    base: str  # <time>-<uid>
    pod_uid: str
    served: int


_DECODER: Final = msgspec.json.Decoder(StagedPod)
_ENCODER: Final = msgspec.json.Encoder()


def entry_name(bind_time_ns: int, pod_uid: str) -> str:
    if bind_time_ns < 0 or not pod_uid or "/" in pod_uid or _SERVED_SEP in pod_uid:
        raise ValueError(f"cannot name a staging entry for bind time {bind_time_ns}, pod {pod_uid!r}")
    return f"{bind_time_ns:0{_TIME_DIGITS}d}-{pod_uid}"


def _parse(file: str) -> _Entry | None:
    base, _, served = file.partition(_SERVED_SEP)
    stamp, dash, uid = base.partition("-")
    if not dash or not uid or len(stamp) != _TIME_DIGITS or not stamp.isdigit():
        return None
    if served and not served.isdigit():
        return None
    return _Entry(file=file, base=base, pod_uid=uid, served=int(served or 0))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(target: Path, data: bytes, *, mode: int, durable: bool) -> None:
    tmp = target.with_name(f"{_TMP_PREFIX}{target.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(target.parent)


class StagingStore:
    """One staging directory. Not thread-safe: each process serialises its own calls (the device plugin
    answers Allocate one at a time, as HAMi does); the two processes coordinate only through renames."""

    def __init__(self, root: Path | str, *, done_keep: int = DONE_KEEP) -> None:
        self.root = Path(root)
        self.done_keep = done_keep
        self._dir = str(self.root)
        # Entries never change content (only their names move), so what was decoded once is kept until the
        # entry leaves the directory: a GetPreferredAllocation peek makes the Allocate that follows cheaper.
        self._decoded: dict[str, StagedPod] = {}

    # --- both sides -----------------------------------------------------------------------------------------

    def _entries(self) -> list[_Entry]:
        try:
            names = os.listdir(self._dir)
        except OSError:
            return []  # missing or unreadable: nothing staged
        found = (_parse(n) for n in names if not n.startswith(_TMP_PREFIX))
        entries = sorted((e for e in found if e is not None), key=lambda e: e.base)
        if len(self._decoded) > len(entries):
            present = {e.base for e in entries}
            self._decoded = {k: v for k, v in self._decoded.items() if k in present}
        return entries

    def _entries_of(self, pod_uid: str) -> Iterator[_Entry]:
        return (e for e in self._entries() if e.pod_uid == pod_uid)

    def staged_uids(self) -> list[str]:
        """Pods with unserved containers, oldest bind first."""
        return [e.pod_uid for e in self._entries()]

    def get(self, pod_uid: str) -> StagedPod | None:
        for entry in self._entries_of(pod_uid):
            with contextlib.suppress(OSError, msgspec.DecodeError, msgspec.ValidationError):
                return self._read(entry)
        return None

    def _read(self, entry: _Entry) -> StagedPod:
        cached = self._decoded.get(entry.base)
        if cached is not None:
            return cached
        with open(os.path.join(self._dir, entry.file), "rb") as f:
            data = f.read(_MAX_ENTRY_BYTES + 1)
        if len(data) > _MAX_ENTRY_BYTES:
            raise msgspec.DecodeError(f"larger than {_MAX_ENTRY_BYTES} bytes")
        pod = _DECODER.decode(data)
        self._decoded[entry.base] = pod
        return pod

    def _move(self, entry: _Entry, served: int, total: int) -> None:
        """Rename ``entry`` to record ``served`` containers; into ``done/`` when that is all of them."""
        source = os.path.join(self._dir, entry.file)
        if served < total:
            os.replace(source, os.path.join(self._dir, f"{entry.base}{_SERVED_SEP}{served}"))
            return
        target = os.path.join(self._dir, DONE, entry.base)
        try:
            os.replace(source, target)
        except FileNotFoundError:
            if not os.path.exists(source):
                raise
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(source, target)
        self._decoded.pop(entry.base, None)

    def _set_aside(self, entry: _Entry, folder: str) -> None:
        self._decoded.pop(entry.base, None)
        target = self.root / folder
        with contextlib.suppress(OSError):
            target.mkdir(exist_ok=True)
            os.replace(self.root / entry.file, target / entry.file)
            return
        with contextlib.suppress(OSError):
            (self.root / entry.file).unlink()

    # --- writer side (node agent) ---------------------------------------------------------------------------

    def put(self, pod: StagedPod) -> bool:
        """Stage ``pod`` durably; False (and nothing written) if this pod was staged before.

        The containers' host files (:func:`write_host_files`) are written first, so serving the entry later
        costs the device plugin no more than a rename; ``OSError`` when they cannot be written.
        """
        name = entry_name(pod.bind_time_ns, pod.pod_uid)
        if any(True for _ in self._entries_of(pod.pod_uid)) or any(
            (self.root / folder / name).exists() for folder in (DONE, GONE)
        ):
            return False
        for container in pod.containers:
            write_host_files(container)
        self.root.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.root / name, _ENCODER.encode(pod), mode=0o644, durable=True)
        self.prune()
        return True

    def remove(self, pod_uid: str) -> bool:
        """Drop the entry of a pod that is gone; True if there was one."""
        removed = False
        for entry in self._entries_of(pod_uid):
            with contextlib.suppress(FileNotFoundError):
                (self.root / entry.file).unlink()
                removed = True
        return removed

    def prune(self) -> None:
        """Keep only the newest ``done_keep`` set-aside entries of each folder."""
        for folder in (DONE, GONE):
            path = self.root / folder
            try:
                names = sorted(os.listdir(path))
            except OSError:
                continue
            for old in names[: max(len(names) - self.done_keep, 0)]:
                with contextlib.suppress(OSError):
                    (path / old).unlink()

    # --- reader side (device plugin) ------------------------------------------------------------------------

    def _candidates(
        self, device_count: int, gone: Container[str], problems: list[str], pod_uid: str | None = None
    ) -> Iterator[tuple[_Entry, StagedPod]]:
        for entry in self._entries() if pod_uid is None else list(self._entries_of(pod_uid)):
            if entry.pod_uid in gone:
                log.info(
                    "pod is gone: its staged entry %s is set aside", entry.file, extra={logkeys.POD_UID: entry.pod_uid}
                )
                self._set_aside(entry, GONE)
                continue
            try:
                pod = self._read(entry)
            except FileNotFoundError:
                continue  # removed by the node agent meanwhile
            except (OSError, msgspec.DecodeError, msgspec.ValidationError) as err:
                problem = f"staged entry {entry.file} is corrupt ({err}); set aside"
                log.warning("%s", problem, extra={logkeys.POD_UID: entry.pod_uid})
                problems.append(problem)
                self._set_aside(entry, CORRUPT)
                continue
            if entry.served >= len(pod.containers):
                self._set_aside(entry, DONE)
                continue
            if pod.containers[entry.served].device_count == device_count:
                yield entry, pod

    def peek(self, device_count: int, *, gone: Container[str] = (), pod_uid: str | None = None) -> Claim | None:
        """What :meth:`claim` would hand out now, without recording anything (GetPreferredAllocation)."""
        for entry, pod in self._candidates(device_count, gone, [], pod_uid):
            return Claim(pod=pod, index=entry.served, complete=entry.served + 1 == len(pod.containers))
        return None

    def claim(self, device_count: int, *, gone: Container[str] = (), pod_uid: str | None = None) -> ClaimOutcome:
        """Serve the oldest pod whose next unserved container asks for ``device_count`` devices; only the pod
        ``pod_uid`` when it is given (the pod the kubelet is known to be admitting)."""
        problems: list[str] = []
        for entry, pod in self._candidates(device_count, gone, problems, pod_uid):
            served = entry.served + 1
            complete = served == len(pod.containers)
            try:
                self._move(entry, served, len(pod.containers))
            except FileNotFoundError:
                continue  # the node agent removed it between our read and our rename
            return ClaimOutcome(Claim(pod=pod, index=entry.served, complete=complete), tuple(problems))
        return ClaimOutcome(None, tuple(problems))

    def skip(self, pod_uid: str) -> None:
        """Record one more container of ``pod_uid`` as served elsewhere (by the annotation fallback)."""
        for entry in self._entries_of(pod_uid):
            with contextlib.suppress(OSError, msgspec.DecodeError, msgspec.ValidationError):
                self._move(entry, entry.served + 1, len(self._read(entry).containers))
            return


def has_host_files(allocation: ContainerAllocation) -> bool:
    """Whether the host files of ``allocation`` are in place (two ``stat`` calls); a MIG answer has none."""
    if allocation.mig:
        return True
    return os.path.isdir(allocation.cache_dir) and os.path.isfile(allocation.limits_host_path)


def write_host_files(allocation: ContainerAllocation) -> None:
    """Create the container's cache directory (world-writable, as HAMi does) and its read-only limits
    file. Idempotent; raises ``OSError`` when the host paths cannot be written. A MIG answer mounts
    nothing, so nothing is written for it."""
    if allocation.mig:
        return
    cache = Path(allocation.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    os.chmod(cache, 0o777)  # processes of any uid in the container share the cache file
    limits = Path(allocation.limits_host_path)
    limits.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(limits, allocation.limits_content.encode(), mode=0o444, durable=False)
