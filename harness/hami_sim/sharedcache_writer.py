"""A test-only writer of HAMi-core shared-cache files (vgpu-interposer §5.2, §5.3), for tests and the local stack.

It follows the spec's offset tables on its own, field by field, and shares nothing with the reader in
:mod:`hami_common.sharedcache`, so each checks the other: a file built here must decode to the figures it
was built from. Only what a test needs is modelled; semaphores stay zero.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

__all__ = ["CacheSpec", "Memory", "ProcSpec", "build_cache", "write_cache"]

Version = Literal["1.2", "1.1", "v0"]
MAGIC_FLAG: Final = 19920718


@dataclass(frozen=True, slots=True)
class Memory:
    """One ``device_memory_t``; ``total`` defaults to the sum, as libvgpu keeps it."""

    context: int = 0
    module: int = 0
    data: int = 0
    offset: int = 0
    total: int | None = None

    def total_bytes(self) -> int:
        return self.context + self.module + self.data if self.total is None else self.total


@dataclass(frozen=True, slots=True)
class ProcSpec:
    pid: int
    hostpid: int = 0
    status: int = 1
    memory: Mapping[int, Memory] = field(default_factory=dict)  # device index -> usage
    sm_util: Mapping[int, int] = field(default_factory=dict)
    monitor_used: Mapping[int, int] = field(default_factory=dict)
    seqlock: int = 0  # v1.2 only; odd = write in progress


@dataclass(frozen=True, slots=True)
class CacheSpec:
    version: Version = "1.2"
    uuids: tuple[str, ...] = ()
    limits: tuple[int, ...] = ()  # bytes per device
    sm_limits: tuple[int, ...] = ()
    procs: tuple[ProcSpec, ...] = ()
    utilization_switch: int = 1
    recent_kernel: int = 2
    priority: int = 1
    last_kernel_time: int = 0
    magic: int = MAGIC_FLAG
    device_num: int | None = None  # defaults to len(uuids)
    proc_num: int | None = None  # defaults to len(procs)


@dataclass(frozen=True, slots=True)
class _Offsets:
    """The spec's tables, copied by hand: region fields, then slot fields relative to the slot."""

    sizeof: int
    device_num: int
    uuids: int
    limit: int
    sm_limit: int
    procs: int
    slot: int
    used: int
    used_entry: int
    monitorused: int
    util: int
    util_entry: int
    status: int
    tail: int  # proc_num; utilization_switch, recent_kernel, priority follow at +4, +8, +12


_V1: Final = _Offsets(2008952, 56, 64, 1600, 1728, 1856, 1960, 8, 64, 1032, 1160, 48, 1928, 2008896)
_V0: Final = _Offsets(1197896, 48, 56, 1592, 1720, 1848, 1168, 8, 40, 648, 776, 24, 1160, 1197880)
_V1_LAST_KERNEL_TIME: Final = 2008912
_V1_SEQLOCK: Final = 1936


def build_cache(spec: CacheSpec) -> bytes:
    """The bytes of a file libvgpu would have left: ``sizeof(shared_region_t) + 1`` long."""
    o = _V0 if spec.version == "v0" else _V1
    buf = bytearray(o.sizeof + 1)
    struct.pack_into("<i", buf, 0, spec.magic)
    if spec.version != "v0":
        struct.pack_into("<II", buf, 4, 1, 2 if spec.version == "1.2" else 1)
        struct.pack_into("<Q", buf, _V1_LAST_KERNEL_TIME, spec.last_kernel_time)
    device_num = len(spec.uuids) if spec.device_num is None else spec.device_num
    struct.pack_into("<Q", buf, o.device_num, device_num)
    for i, uuid in enumerate(spec.uuids):
        raw = uuid.encode()[:95]
        buf[o.uuids + 96 * i : o.uuids + 96 * i + len(raw)] = raw
    for i, limit in enumerate(spec.limits):
        struct.pack_into("<Q", buf, o.limit + 8 * i, limit)
    for i, sm in enumerate(spec.sm_limits):
        struct.pack_into("<Q", buf, o.sm_limit + 8 * i, sm)
    for k, proc in enumerate(spec.procs):
        base = o.procs + k * o.slot
        struct.pack_into("<ii", buf, base, proc.pid, proc.hostpid)
        for i, mem in proc.memory.items():
            at = base + o.used + i * o.used_entry
            struct.pack_into("<QQQQQ", buf, at, mem.context, mem.module, mem.data, mem.offset, mem.total_bytes())
        for i, used in proc.monitor_used.items():
            struct.pack_into("<Q", buf, base + o.monitorused + 8 * i, used)
        for i, util in proc.sm_util.items():
            struct.pack_into("<Q", buf, base + o.util + i * o.util_entry + 16, util)  # dec, enc, then sm
        struct.pack_into("<i", buf, base + o.status, proc.status)
        if spec.version == "1.2":
            struct.pack_into("<Q", buf, base + _V1_SEQLOCK, proc.seqlock)
    proc_num = len(spec.procs) if spec.proc_num is None else spec.proc_num
    struct.pack_into("<iiii", buf, o.tail, proc_num, spec.utilization_switch, spec.recent_kernel, spec.priority)
    return bytes(buf)


def write_cache(path: Path, spec: CacheSpec) -> Path:
    """Write the file the way libvgpu leaves it on the host: mode 0666, then atomically in place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(build_cache(spec))
    os.chmod(tmp, 0o666)
    os.replace(tmp, path)
    return path
