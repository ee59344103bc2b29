"""A reader of the shared-cache file that follows the spec's byte offsets (vgpu-interposer.md §5.2).

It shares no code with the C library: offsets are the spec's, so the library's struct is checked against
the documented layout, not against itself.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

FILE_SIZE: Final = 2_008_953  # sizeof(shared_region_t) + 1
MAGIC: Final = 19920718
SLOTS: Final = 1856
SLOT_SIZE: Final = 1960
PROC_NUM: Final = 2_008_896
UTILIZATION_SWITCH: Final = 2_008_900
RECENT_KERNEL: Final = 2_008_904
PRIORITY: Final = 2_008_908
LAST_KERNEL_TIME: Final = 2_008_912
LIMITS: Final = 1600
SM_LIMITS: Final = 1728
DEVICE_NUM: Final = 56
UUIDS: Final = 64


@dataclass(frozen=True, slots=True)
class Slot:
    pid: int
    hostpid: int
    status: int
    total: tuple[int, ...]  # used[d].total
    data_size: tuple[int, ...]
    context_size: tuple[int, ...]  # used[d].context_size: HAMi's context field
    sm_util: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CacheFile:
    size: int
    magic: int
    major: int
    minor: int
    device_num: int
    uuid0: str
    limits: tuple[int, ...]
    sm_limits: tuple[int, ...]
    proc_num: int
    utilization_switch: int
    recent_kernel: int
    priority: int
    last_kernel_time: int
    slots: tuple[Slot, ...]

    def live_slots(self) -> tuple[Slot, ...]:
        return tuple(s for s in self.slots if s.status != 0)

    def usage(self, device: int = 0) -> int:
        return sum(s.total[device] for s in self.slots)


def _u64s(data: bytes, offset: int, count: int) -> tuple[int, ...]:
    return struct.unpack_from(f"<{count}Q", data, offset)


def _slot(data: bytes, index: int) -> Slot:
    base = SLOTS + index * SLOT_SIZE
    pid, hostpid = struct.unpack_from("<ii", data, base)
    used = base + 8
    return Slot(
        pid=pid,
        hostpid=hostpid,
        status=struct.unpack_from("<i", data, base + 1928)[0],
        total=tuple(_u64s(data, used + 64 * d + 32, 1)[0] for d in range(16)),
        data_size=tuple(_u64s(data, used + 64 * d + 16, 1)[0] for d in range(16)),
        context_size=tuple(_u64s(data, used + 64 * d, 1)[0] for d in range(16)),
        sm_util=tuple(_u64s(data, base + 1160 + 48 * d + 16, 1)[0] for d in range(16)),
    )


def read_cache(path: Path) -> CacheFile:
    data = path.read_bytes()
    magic, major, minor = struct.unpack_from("<iII", data, 0)
    proc_num, switch, recent, priority = struct.unpack_from("<iiii", data, PROC_NUM)
    return CacheFile(
        size=len(data),
        magic=magic,
        major=major,
        minor=minor,
        device_num=_u64s(data, DEVICE_NUM, 1)[0],
        uuid0=data[UUIDS : UUIDS + 96].split(b"\0", 1)[0].decode(),
        limits=_u64s(data, LIMITS, 16),
        sm_limits=_u64s(data, SM_LIMITS, 16),
        proc_num=proc_num,
        utilization_switch=switch,
        recent_kernel=recent,
        priority=priority,
        last_kernel_time=_u64s(data, LAST_KERNEL_TIME, 1)[0],
        slots=tuple(_slot(data, i) for i in range(max(proc_num, 0))),
    )


def write_i32(path: Path, offset: int, value: int) -> None:
    """What HAMi's monitor does to recent_kernel and utilization_switch: a 4-byte store in place."""
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(struct.pack("<i", value))


def write_hami_core_v11(path: Path, limit: int) -> None:
    """A cache file as an older HAMi-core (layout 1.1) leaves it: header, one limit, no processes."""
    data = bytearray(FILE_SIZE)
    struct.pack_into("<iII", data, 0, MAGIC, 1, 1)
    struct.pack_into("<16Q", data, LIMITS, *([limit] + [0] * 15))
    struct.pack_into("<16Q", data, SM_LIMITS, *([100] * 16))
    struct.pack_into("<iiii", data, PROC_NUM, 0, 1, 2, 1)
    path.write_bytes(bytes(data))
