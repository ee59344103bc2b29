"""The shared-cache reader against files built by the independent test writer (vgpu-interposer §5, §6)."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_common.errors import InvalidInput
from hami_common.sharedcache import (
    MAX_FILE_SIZE,
    V0,
    V1,
    decode_shared_cache,
    read_shared_cache,
    write_feedback,
)
from hami_sim.sharedcache_writer import CacheSpec, Memory, ProcSpec, build_cache, write_cache

MIB = 1024 * 1024
UUID_A = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec"
UUID_B = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"

TWO_PROCS = CacheSpec(
    uuids=(UUID_A, UUID_B),
    limits=(3000 * MIB, 5000 * MIB),
    sm_limits=(30, 100),
    procs=(
        ProcSpec(
            pid=17, hostpid=4242,
            memory={0: Memory(context=300 * MIB, data=312 * MIB), 1: Memory(context=100 * MIB, module=4 * MIB)},
            sm_util={0: 20, 1: 5}, monitor_used={0: 640 * MIB},
        ),
        ProcSpec(pid=18, memory={0: Memory(context=100 * MIB, data=88 * MIB)}, sm_util={0: 7}),
        ProcSpec(pid=0, status=0, memory={0: Memory(data=999 * MIB)}, sm_util={0: 50}),  # exited, not compacted
    ),
    utilization_switch=0, recent_kernel=2, priority=1, last_kernel_time=1_780_000_000,
)  # fmt: skip


def test_v1_2_file_decodes_to_the_figures_it_was_built_from() -> None:
    cache = decode_shared_cache(build_cache(TWO_PROCS))
    assert (cache.format, cache.major, cache.minor, cache.proc_num) == ("v1.2", 1, 2, 3)
    first, second = cache.devices
    assert (first.uuid, first.limit_bytes, first.sm_limit_percent) == (UUID_A, 3000 * MIB, 30)
    assert first.used_bytes == (612 + 188) * MIB  # the exited slot is not counted
    assert (first.context_bytes, first.buffer_bytes, first.module_bytes) == (400 * MIB, 400 * MIB, 0)
    assert (first.sm_util_percent, first.monitor_used_bytes) == (27, 640 * MIB)
    assert (second.uuid, second.used_bytes, second.module_bytes) == (UUID_B, 104 * MIB, 4 * MIB)
    assert (cache.utilization_switch, cache.recent_kernel, cache.priority) == (0, 2, 1)
    assert cache.last_kernel_time_s == 1_780_000_000
    assert [(p.pid, p.hostpid, p.status) for p in cache.processes] == [(17, 4242, 1), (18, 0, 1), (0, 0, 0)]
    assert cache.processes[2].used_bytes[0] == 999 * MIB


def test_file_is_one_byte_longer_than_the_struct_as_libvgpu_leaves_it() -> None:
    assert len(build_cache(TWO_PROCS)) == 2_008_953
    assert len(build_cache(CacheSpec(version="v0"))) == 1_197_897
    assert (V1.size, V0.size) == (2_008_952, 1_197_896)


def test_v1_1_file_decodes_at_the_same_offsets() -> None:
    cache = decode_shared_cache(build_cache(dataclasses.replace(TWO_PROCS, version="1.1")))
    assert (cache.format, cache.minor) == ("v1.1", 1)
    assert cache.devices[0].used_bytes == 800 * MIB


def test_v0_file_is_recognised_by_size_and_has_no_kernel_time() -> None:
    spec = dataclasses.replace(TWO_PROCS, version="v0")
    cache = decode_shared_cache(build_cache(spec))
    assert cache.format == "v0"
    assert [d.used_bytes for d in cache.devices] == [800 * MIB, 104 * MIB]
    assert (cache.devices[0].sm_util_percent, cache.devices[1].limit_bytes) == (27, 5000 * MIB)
    assert (cache.priority, cache.recent_kernel, cache.last_kernel_time_s) == (1, 2, 0)


def test_device_count_is_capped_at_sixteen_like_hamis_monitor() -> None:
    cache = decode_shared_cache(build_cache(CacheSpec(uuids=(UUID_A,), device_num=40)))
    assert len(cache.devices) == 16
    assert cache.devices[0].uuid == UUID_A
    assert cache.devices[1].uuid == ""


def test_slot_left_odd_by_a_killed_writer_is_read_and_flagged() -> None:
    spec = CacheSpec(uuids=(UUID_A,), procs=(ProcSpec(pid=5, memory={0: Memory(data=MIB)}, seqlock=7),))
    cache = decode_shared_cache(build_cache(spec))
    assert cache.devices[0].used_bytes == MIB
    assert cache.processes[0].consistent is False


def _patched(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


GOOD = build_cache(TWO_PROCS)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        pytest.param(b"", "truncated", id="an empty file is truncated"),
        pytest.param(GOOD[:8], "truncated", id="a file shorter than the header is truncated"),
        pytest.param(GOOD[:100_000], "truncated", id="a v1 file cut short is truncated"),
        pytest.param(GOOD[: V1.size - 1], "truncated", id="a v1 file one byte short of the struct is truncated"),
        pytest.param(GOOD + bytes(MAX_FILE_SIZE), "oversized", id="a file far longer than any layout is oversized"),
        pytest.param(_patched(GOOD, 0, "<i", 0), "magic", id="a file without the magic is refused"),
        pytest.param(_patched(GOOD, 4, "<I", 7), "unknown", id="an unknown major version is refused"),
        pytest.param(_patched(GOOD, V1.proc_num, "<i", 5000), "proc_num", id="more processes than slots is corrupt"),
        pytest.param(_patched(GOOD, V1.proc_num, "<i", -1), "proc_num", id="a negative process count is corrupt"),
        pytest.param(
            _patched(GOOD, 8, "<I", 1) + bytes(31), "interim", id="the interim layout that claims 1.1 is refused"
        ),
    ],
)
def test_malformed_files_raise_invalid_input(data: bytes, words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        decode_shared_cache(data)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=len(GOOD)))
def test_any_header_damage_or_cut_raises_invalid_input_or_decodes(junk: bytes, cut: int) -> None:
    data = junk + GOOD[len(junk) : cut]
    try:
        cache = decode_shared_cache(data)
    except InvalidInput:
        return
    assert 0 <= cache.proc_num <= 1024


def test_file_reader_reads_live_files_and_refuses_bad_ones(tmp_path: Path) -> None:
    good = write_cache(tmp_path / "a.cache", TWO_PROCS)
    assert read_shared_cache(good).devices[0].used_bytes == 800 * MIB
    cut = tmp_path / "b.cache"
    cut.write_bytes(GOOD[:5000])
    with pytest.raises(InvalidInput, match="truncated"):
        read_shared_cache(cut)


def test_feedback_write_changes_only_the_monitor_fields(tmp_path: Path) -> None:
    path = write_cache(tmp_path / "c.cache", TWO_PROCS)
    write_feedback(path, recent_kernel=-1, utilization_switch=1)
    after = path.read_bytes()
    cache = decode_shared_cache(after)
    assert (cache.recent_kernel, cache.utilization_switch, cache.priority) == (-1, 1, 1)
    changed = [i for i, (a, b) in enumerate(zip(GOOD, after, strict=True)) if a != b]
    assert changed
    assert all(V1.utilization_switch <= i < V1.recent_kernel + 4 for i in changed)


def test_feedback_is_never_written_into_a_file_that_is_no_cache(tmp_path: Path) -> None:
    path = tmp_path / "d.cache"
    path.write_bytes(bytes(V1.size + 1))
    with pytest.raises(InvalidInput, match="magic"):
        write_feedback(path, recent_kernel=0)
    assert path.read_bytes() == bytes(V1.size + 1)


def test_symlinked_file_is_neither_read_nor_written_through(tmp_path: Path) -> None:
    target = write_cache(tmp_path / "outside" / "victim.cache", TWO_PROCS)
    link = tmp_path / "e.cache"
    link.symlink_to(target)
    with pytest.raises(InvalidInput, match="symbolic link"):
        read_shared_cache(link)
    with pytest.raises(InvalidInput, match="symbolic link"):
        write_feedback(link, recent_kernel=-1)
    assert target.read_bytes() == GOOD


def test_directory_named_like_a_cache_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f.cache").mkdir()
    with pytest.raises(InvalidInput, match="directory"):
        read_shared_cache(tmp_path / "f.cache")
