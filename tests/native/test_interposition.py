"""The three ways a CUDA program reaches the driver - direct linking, dlsym and cuGetProcAddress - all
land in libvgpu, and nothing else is taken over."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from tests.native._probe import BUILD, VGPU_DIR, Probe


@pytest.mark.parametrize("name", ["cuMemAlloc_v2", "cuLaunchKernel", "cuGetProcAddress_v2", "nvmlDeviceGetMemoryInfo"])
def test_dlsym_on_the_driver_handle_returns_the_interposer(probe: Probe, name: str) -> None:
    found = probe.run(f"whois:{name}").one("whois")
    assert (found.fields["object"], found.fields["symbol"]) == ("libvgpu.so", name)


@pytest.mark.parametrize("name", ["cudnnCreate", "cudaMalloc", "cuDeviceGet"])
def test_dlsym_leaves_other_names_to_their_library(probe: Probe, name: str) -> None:
    found = probe.run(f"whois:{name}").one("whois")
    assert (found.fields["object"], found.fields["symbol"]) == ("libcuda.so.1", name)


@pytest.mark.parametrize(("name", "owner"), [("cuMemAlloc_v2", "libvgpu.so"), ("cudnnCreate", "libcuda.so.1")])
def test_dlsym_rtld_next_answers_the_same_every_time(probe: Probe, name: str, owner: str) -> None:
    found = probe.run(f"next:{name}").one("next")
    assert (found.fields["object"], found.fields["same"]) == (owner, "1")


@pytest.mark.parametrize(
    ("symbol", "version", "flags", "wrapper"),
    [
        ("cuMemAlloc", 12000, 0, "cuMemAlloc_v2"),
        ("cuMemAlloc", 13000, 0, "cuMemAlloc_v2"),
        ("cuMemGetInfo", 12080, 0, "cuMemGetInfo_v2"),
        ("cuLaunchKernel", 12000, 0, "cuLaunchKernel"),
        ("cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz"),
        ("cuMemAllocAsync", 13000, 2, "cuMemAllocAsync_ptsz"),
        ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
        ("cuGetProcAddress", 11080, 0, "cuGetProcAddress"),
        ("nvmlDeviceGetMemoryInfo", 12000, 0, None),
    ],
)
def test_get_proc_address_hands_out_the_wrapper_of_what_the_driver_chose(
    probe: Probe, symbol: str, version: int, flags: int, wrapper: str | None
) -> None:
    found = probe.run(f"procaddr:{symbol}:{version}:{flags}").one("procaddr")
    if wrapper is None:  # not a driver entry point: the driver's own answer, untouched
        assert (found.rc, found.fields["status"]) == (500, "1")
    else:
        assert (found.rc, found.fields["status"]) == (0, "0")
        assert (found.fields["object"], found.fields["symbol"]) == ("libvgpu.so", wrapper)


def test_get_proc_address_v1_is_hooked_too(probe: Probe) -> None:
    found = probe.run("procaddr1:cuMemAlloc:12000").one("procaddr1")
    assert (found.rc, found.fields["object"], found.fields["symbol"]) == (0, "libvgpu.so", "cuMemAlloc_v2")


def _hook_names() -> set[str]:
    text = (VGPU_DIR / "src" / "hook_list.h").read_text()
    hooks = text.split("/* Driver functions libvgpu only calls. */")[0]
    return set(re.findall(r"X\((\w+)\)", hooks))


def test_library_exports_only_hooked_functions_and_dlsym() -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(BUILD / "libvgpu.so")], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert exported == _hook_names() | {"dlsym"}


def test_library_needs_neither_libcuda_nor_libnvidia_ml_at_link_time() -> None:
    out = subprocess.run(["readelf", "-d", str(BUILD / "libvgpu.so")], capture_output=True, text=True, check=True)
    needed = re.findall(r"Shared library: \[(.+?)\]", out.stdout)
    assert not [n for n in needed if "cuda" in n or "nvidia" in n]


def _cuda_home() -> Path:
    """The toolkit when one is installed, else the headers of the ``nvidia-cuda-runtime-cu12`` wheel (a dev
    dependency), so the check runs on every machine."""
    toolkit = Path("/usr/local/cuda")
    if (toolkit / "include" / "cuda.h").exists():
        return toolkit
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    assert spec is not None, "nvidia-cuda-runtime-cu12 (a dev dependency) is not installed"
    assert spec.submodule_search_locations, "nvidia.cuda_runtime has no package directory"
    return Path(next(iter(spec.submodule_search_locations)))


def test_declarations_agree_with_the_toolkit_cuda_h() -> None:
    home = _cuda_home()
    assert (home / "include" / "cuda.h").exists(), home
    done = subprocess.run(
        ["make", "-s", "-C", str(VGPU_DIR), "header-check", f"CUDA_HOME={home}"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
