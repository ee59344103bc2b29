"""CUDA_VISIBLE_DEVICES decides which NVML device a CUDA ordinal is, and so which GPU's NVML memory
information shows the ordinal's slice. Its entries may be NVML indices or GPU UUIDs (whole or a prefix
naming one GPU). The stub has two GPUs, GPU-00000000-0000-0000-0000-00000000000<i>, 16 GiB each."""

from __future__ import annotations

import pytest

from tests.native._probe import GiB, Probe

UUID = "GPU-00000000-0000-0000-0000-00000000000{}"
DEVICE = 16 * GiB


def _nvml_totals(probe: Probe, visible: str) -> list[int]:
    env = {"VGPU_STUB_DEVICES": "2", "CUDA_DEVICE_MEMORY_LIMIT_0": "1g", "CUDA_VISIBLE_DEVICES": visible}
    run = probe.run("init", "nvmlmem:0", "nvmlmem:1", env=env)
    records = run.of("nvmlmem")
    assert [r.rc for r in records] == [0, 0], records
    return [r.num("total") for r in records]


@pytest.mark.parametrize("visible", ["1", UUID.format(1), f"{UUID.format(1)},0"])
def test_cuda_device_0_is_the_gpu_that_cuda_visible_devices_names_first(probe: Probe, visible: str) -> None:
    """CUDA ordinal 0 is NVML's GPU 1: that GPU shows ordinal 0's 1 GiB limit, GPU 0 its own size."""
    assert _nvml_totals(probe, visible) == [DEVICE, GiB]


@pytest.mark.parametrize("visible", [UUID.format(0), "0,1", "1," + UUID.format("")])
def test_without_a_usable_mapping_ordinal_0_is_nvml_gpu_0(probe: Probe, visible: str) -> None:
    """GPU 0 named first, or a list with an entry that cannot be placed - here a UUID prefix that fits
    both GPUs, so names neither - which leaves the identity map, as a list of no integers always did."""
    assert _nvml_totals(probe, visible) == [GiB, DEVICE]
