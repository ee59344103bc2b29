"""Reader of HAMi-core's shared-cache file ("shrreg") and the vGPU monitor's feedback write (vgpu-interposer §5, §6).

Every process of a container maps one file; ``libvgpu.so`` keeps per-process memory and SM figures in it and the
node's monitor reads them and writes two feedback fields back. Three layouts exist:

* **v1.2** (HAMi-core ``b69b1ea`` on): major 1, minor 2, 2 008 952 bytes; each process slot has a seqlock.
* **v1.1** (``9b46404`` on): the same offsets; the seqlock and ``sem_postinit`` bytes are unused.
* **v0** (``7a9c88b``): no version fields, recognised by its size alone (1 197 896 bytes).

The file on disk is one byte longer than the struct. A file too short for its layout is *truncated*, one far
longer is *oversized*, one without the magic or with impossible counts is *corrupt*: each raises
:class:`~hami_common.errors.InvalidInput`. The 2026 interim layout that still says 1.1 but moved every field by
32 bytes is recognised by its size and refused rather than misread.

The files live in folders the containers write, so they are opened as untrusted: never through a symbolic
link, never waiting on a FIFO, and only a regular file is read or written (:func:`open_regular`); anything
else raises :class:`~hami_common.errors.InvalidInput` like a corrupt file.

Sums follow HAMi's monitor: they skip slots whose ``status`` is 0 (exited, awaiting compaction). A v1.2 slot is
read under its seqlock (retried while odd or changing); a slot left odd by a killed writer is taken as read.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Final, Literal

from hami_common.errors import InvalidInput

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "MAX_DEVICES",
    "MAX_FILE_SIZE",
    "MAX_PROCS",
    "V0",
    "V1",
    "CacheFormat",
    "DeviceUsage",
    "Layout",
    "ProcessSlot",
    "SharedCache",
    "decode_shared_cache",
    "layout_of",
    "open_regular",
    "read_shared_cache",
    "write_feedback",
]

MAGIC: Final = 19920718  # MULTIPROCESS_SHARED_REGION_MAGIC_FLAG
HEADER_SIZE: Final = 12  # magic, major, minor: HAMi's monitor needs at least this much to look
MAX_DEVICES: Final = 16
MAX_PROCS: Final = 1024
UUID_BYTES: Final = 96
SIZE_SLACK: Final = 4096  # the file is sizeof+1; anything a page beyond that is not a cache file
_SEQLOCK_TRIES: Final = 4
_INTERIM_SIZE: Final = 2_008_984  # the broken 2026 interim layout, which still claims 1.1

CacheFormat = Literal["v0", "v1.1", "v1.2", "v1"]


@dataclass(frozen=True, slots=True)
class Layout:
    """Offsets of one format: region fields from the file start, slot fields from the slot start."""

    name: Literal["v0", "v1"]
    size: int  # sizeof(shared_region_t)
    device_num: int
    uuids: int
    limit: int
    sm_limit: int
    procs: int
    slot_size: int
    slot_used: int
    memory_entry: int  # sizeof(device_memory_t)
    slot_monitorused: int
    slot_util: int
    util_entry: int  # sizeof(device_util_t)
    slot_status: int
    slot_seqlock: int | None
    proc_num: int
    utilization_switch: int
    recent_kernel: int
    priority: int
    last_kernel_time: int | None


V1: Final = Layout(
    name="v1", size=2_008_952, device_num=56, uuids=64, limit=1600, sm_limit=1728, procs=1856,
    slot_size=1960, slot_used=8, memory_entry=64, slot_monitorused=1032, slot_util=1160, util_entry=48,
    slot_status=1928, slot_seqlock=1936,
    proc_num=2_008_896, utilization_switch=2_008_900, recent_kernel=2_008_904, priority=2_008_908,
    last_kernel_time=2_008_912,
)  # fmt: skip
V0: Final = Layout(
    name="v0", size=1_197_896, device_num=48, uuids=56, limit=1592, sm_limit=1720, procs=1848,
    slot_size=1168, slot_used=8, memory_entry=40, slot_monitorused=648, slot_util=776, util_entry=24,
    slot_status=1160, slot_seqlock=None,
    proc_num=1_197_880, utilization_switch=1_197_884, recent_kernel=1_197_888, priority=1_197_892,
    last_kernel_time=None,
)  # fmt: skip
MAX_FILE_SIZE: Final = V1.size + SIZE_SLACK

_U32: Final = struct.Struct("<I")
_I32: Final = struct.Struct("<i")
_U64: Final = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class ProcessSlot:
    """One process registered in the file; ``used_bytes[i]`` is its accounted total on device i."""

    pid: int
    hostpid: int
    status: int  # 1 running, 2 suspended, 0 exited
    used_bytes: tuple[int, ...]
    consistent: bool = True  # False: the seqlock stayed odd (a writer died mid-update)


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One device of the container, as HAMi's monitor reports it (sums over slots with status != 0)."""

    index: int
    uuid: str
    limit_bytes: int  # 0 = unlimited
    sm_limit_percent: int
    used_bytes: int
    context_bytes: int
    module_bytes: int
    buffer_bytes: int
    offset_bytes: int
    sm_util_percent: int
    monitor_used_bytes: int


@dataclass(frozen=True, slots=True)
class SharedCache:
    format: CacheFormat
    major: int
    minor: int
    devices: tuple[DeviceUsage, ...]
    processes: tuple[ProcessSlot, ...]
    proc_num: int
    utilization_switch: int
    recent_kernel: int
    priority: int
    last_kernel_time_s: int  # 0 in v0, which has no such field

    @property
    def layout(self) -> Layout:
        return V0 if self.format == "v0" else V1


Reader = Callable[[int, int], bytes]  # (offset, length) -> exactly that many bytes, or fewer at end of file


def layout_of(header: bytes, size: int) -> tuple[Layout, CacheFormat, int, int]:
    """Pick the layout from the first 12 bytes and the file size, as HAMi's monitor does; refuse the rest."""
    if size < HEADER_SIZE or len(header) < HEADER_SIZE:
        raise InvalidInput(f"truncated shared-cache file: {size} bytes, the header alone is {HEADER_SIZE}")
    if size > MAX_FILE_SIZE:
        raise InvalidInput(f"oversized shared-cache file: {size} bytes, at most {MAX_FILE_SIZE} expected")
    magic = _I32.unpack_from(header, 0)[0]
    if magic != MAGIC:
        raise InvalidInput(f"corrupt or uninitialised shared-cache file: magic {magic}, expected {MAGIC}")
    if V0.size <= size <= V0.size + SIZE_SLACK:
        return V0, "v0", 0, 0
    major, minor = _U32.unpack_from(header, 4)[0], _U32.unpack_from(header, 8)[0]
    if major != 1:
        if size < V1.size:
            raise InvalidInput(f"truncated shared-cache file: {size} bytes (version {major}.{minor})")
        raise InvalidInput(f"unknown shared-cache version {major}.{minor} ({size} bytes)")
    if size < V1.size:
        raise InvalidInput(f"truncated shared-cache file: {size} bytes, version 1.{minor} needs {V1.size}")
    if minor == 1 and _INTERIM_SIZE <= size <= _INTERIM_SIZE + 1:
        raise InvalidInput("shared-cache file of the interim HAMi-core layout (1988c5d..b69b1ea), not readable")
    fmt: CacheFormat = "v1.1" if minor == 1 else "v1.2" if minor == 2 else "v1"
    return V1, fmt, major, minor


def _int(reader: Reader, fmt: struct.Struct, offset: int) -> int:
    data = reader(offset, fmt.size)
    if len(data) < fmt.size:
        raise InvalidInput(f"truncated shared-cache file: nothing at offset {offset}")
    value: int = fmt.unpack_from(data, 0)[0]
    return value


def _slot_struct(layout: Layout) -> struct.Struct:
    """One slot's fields up to ``status`` in one unpack: pid, hostpid, 16 x (context, module, data, offset, total),
    16 x monitorused, 16 x sm_util, status. Checked against the offset table when the module loads."""
    memory = "5Q" + f"{layout.memory_entry - 40}x" * (layout.memory_entry > 40)
    util = "16xQ" + f"{layout.util_entry - 24}x" * (layout.util_entry > 24)  # dec_util, enc_util skipped
    compiled = struct.Struct(f"<ii{memory * MAX_DEVICES}{MAX_DEVICES}Q{util * MAX_DEVICES}i")
    expected = (layout.slot_used + MAX_DEVICES * layout.memory_entry, layout.slot_status + 4)
    if (layout.slot_monitorused, compiled.size) != expected or layout.slot_util != expected[0] + 8 * MAX_DEVICES:
        raise AssertionError(f"layout {layout.name}: offset table and slot fields disagree")
    return compiled


_SLOTS: Final = {V1.name: _slot_struct(V1), V0.name: _slot_struct(V0)}
_MONITOR_AT: Final = 2 + 5 * MAX_DEVICES  # indices into a slot's unpacked fields
_SM_AT: Final = _MONITOR_AT + MAX_DEVICES
_STATUS_AT: Final = _SM_AT + MAX_DEVICES


def _slot_region(reader: Reader, layout: Layout, proc_num: int, seqlocked: bool) -> tuple[bytes, list[bool]]:
    """The bytes of the slots in use; under a seqlock, slots caught mid-write are read again."""
    size = proc_num * layout.slot_size
    region = reader(layout.procs, size)
    if len(region) < size:
        raise InvalidInput("truncated shared-cache file: the process slots are cut off")
    consistent = [True] * proc_num
    if not seqlocked or layout.slot_seqlock is None or not proc_num:
        return region, consistent
    at = layout.slot_seqlock
    again = reader(layout.procs, size)
    fixed = bytearray(region)
    for k in range(proc_num):
        start = k * layout.slot_size
        before = _U64.unpack_from(region, start + at)[0]
        if len(again) == size and before % 2 == 0 and before == _U64.unpack_from(again, start + at)[0]:
            continue
        consistent[k] = False
        for _ in range(_SEQLOCK_TRIES):
            data = reader(layout.procs + start, layout.slot_size)
            seq = _U64.unpack_from(data, at)[0] if len(data) == layout.slot_size else 1
            if seq % 2 == 0 and seq == _int(reader, _U64, layout.procs + start + at):
                fixed[start : start + layout.slot_size] = data
                consistent[k] = True
                break
    return bytes(fixed), consistent


def _decode(reader: Reader, size: int) -> SharedCache:
    layout, fmt, major, minor = layout_of(reader(0, HEADER_SIZE), size)
    proc_num = _int(reader, _I32, layout.proc_num)
    if not 0 <= proc_num <= MAX_PROCS:
        raise InvalidInput(f"corrupt shared-cache file: proc_num {proc_num} outside 0..{MAX_PROCS}")
    device_num = min(_int(reader, _U64, layout.device_num), MAX_DEVICES)
    head = reader(0, layout.procs)
    if len(head) < layout.procs:
        raise InvalidInput("truncated shared-cache file: the device table is cut off")
    seqlocked = fmt == "v1.2" or (fmt == "v1" and minor > 2)
    region, consistent = _slot_region(reader, layout, proc_num, seqlocked)
    unpack = _SLOTS[layout.name].unpack_from
    fields = [unpack(region, k * layout.slot_size) for k in range(proc_num)]
    slots = tuple(
        ProcessSlot(f[0], f[1], f[_STATUS_AT], f[6 : 6 + 5 * device_num : 5], consistent[k])
        for k, f in enumerate(fields)
    )
    active = [f for f in fields if f[_STATUS_AT] != 0]  # exited slots await compaction: HAMi does not count them

    def column(index: int) -> int:
        return sum(map(itemgetter(index), active))

    # per device: total, context, module, data (buffer), offset, sm_util, monitorused
    totals = [
        [column(6 + 5 * i), column(2 + 5 * i), column(3 + 5 * i), column(4 + 5 * i), column(5 + 5 * i),
         column(_SM_AT + i), column(_MONITOR_AT + i)]
        for i in range(device_num)
    ]  # fmt: skip
    devices = tuple(
        DeviceUsage(
            index=i,
            uuid=head[layout.uuids + i * UUID_BYTES : layout.uuids + (i + 1) * UUID_BYTES]
            .split(b"\0", 1)[0]
            .decode("ascii", "replace"),
            limit_bytes=_U64.unpack_from(head, layout.limit + 8 * i)[0],
            sm_limit_percent=_U64.unpack_from(head, layout.sm_limit + 8 * i)[0],
            used_bytes=totals[i][0],
            context_bytes=totals[i][1],
            module_bytes=totals[i][2],
            buffer_bytes=totals[i][3],
            offset_bytes=totals[i][4],
            sm_util_percent=totals[i][5],
            monitor_used_bytes=totals[i][6],
        )
        for i in range(device_num)
    )
    return SharedCache(
        format=fmt,
        major=major,
        minor=minor,
        devices=devices,
        processes=slots,
        proc_num=proc_num,
        utilization_switch=_int(reader, _I32, layout.utilization_switch),
        recent_kernel=_int(reader, _I32, layout.recent_kernel),
        priority=_int(reader, _I32, layout.priority),
        last_kernel_time_s=0 if layout.last_kernel_time is None else _int(reader, _U64, layout.last_kernel_time),
    )


def decode_shared_cache(data: bytes) -> SharedCache:
    """Decode a whole file's bytes (pure). Raises InvalidInput for truncated, oversized or corrupt input."""
    view = memoryview(data)
    return _decode(lambda offset, length: bytes(view[offset : offset + length]), len(data))


_KINDS: Final = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _not_regular(path: Path | str, mode: int) -> InvalidInput:
    kind = next((name for test, name in _KINDS if test(mode)), "not a plain file")
    return InvalidInput(f"{path} is {kind}, not a regular file: not read")


def open_regular(path: Path | str, flags: int) -> tuple[int, int]:
    """Open a file in a folder a tenant writes: returns ``(fd, size)`` of a regular file, else raises
    :class:`InvalidInput`. ``lstat`` first, so a device node or FIFO is never even opened; then
    ``O_NOFOLLOW`` (a link swapped in meanwhile fails instead of being followed) and ``O_NONBLOCK`` (a FIFO
    swapped in cannot block the open), and ``fstat`` decides on what was really opened."""
    mode = os.lstat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _not_regular(path, stat.S_IFLNK) from err
        raise
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _not_regular(path, info.st_mode)
    return fd, info.st_size


def read_shared_cache(path: Path | str) -> SharedCache:
    """Read a live file with positioned reads of the parts in use, never mapping it (a file truncated under a
    mapping would kill the reader with SIGBUS). Every read has a fixed length within the size the layout
    allows. Blocking: call it through ``asyncio.to_thread``."""
    fd, size = open_regular(path, os.O_RDONLY)
    try:
        return _decode(lambda offset, length: os.pread(fd, length, offset), size)
    finally:
        os.close(fd)


def write_feedback(
    path: Path | str,
    *,
    recent_kernel: int | None = None,
    utilization_switch: int | None = None,
    priority: int | None = None,
) -> None:
    """Write the fields HAMi's monitor owns back into a live file (4-byte aligned stores, nothing else).

    The file's header is checked again first, so a file replaced by something else is never written into,
    and a symbolic link is never followed (the feedback would land in its target).
    Blocking: call it through ``asyncio.to_thread``.
    """
    fd, size = open_regular(path, os.O_RDWR)
    try:
        layout, _, _, _ = layout_of(os.pread(fd, HEADER_SIZE, 0), size)
        for offset, value in (
            (layout.recent_kernel, recent_kernel),
            (layout.utilization_switch, utilization_switch),
            (layout.priority, priority),
        ):
            if value is not None:
                os.pwrite(fd, _I32.pack(value), offset)
    finally:
        os.close(fd)
