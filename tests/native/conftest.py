"""Fixtures for the libvgpu tests: the compiled programs (built by `make -C native/vgpu`) and a probe
bound to a fresh shared-cache file, in the plain and the AddressSanitizer+UBSan build."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.native._probe import BUILD, VGPU_DIR, Probe, Variant


@pytest.fixture(scope="session", autouse=True)
def _built() -> None:
    if not (BUILD / "asan" / "vgpu_probe").exists():
        subprocess.run(["make", "-s", "-C", str(VGPU_DIR)], check=True)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "vgpu.cache"


@pytest.fixture(params=["plain", "asan"])
def variant(request: pytest.FixtureRequest) -> Variant:
    value: Variant = request.param
    return value


@pytest.fixture
def probe(variant: Variant, cache: Path) -> Probe:
    return Probe(variant, cache)


@pytest.fixture
def plain_probe(cache: Path) -> Probe:
    """For timing-heavy scenarios, where the sanitized run would only repeat the plain one slowly."""
    return Probe("plain", cache)
