"""Every container environment variable the device plugin sets or reads (hami-protocol §5.4,
vgpu-interposer §2): the only place these names are spelt.

Values are HAMi's: ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` is MiB with a lower-case ``m`` suffix,
``CUDA_DEVICE_SM_LIMIT`` a plain percentage, ``NVIDIA_VISIBLE_DEVICES`` comma-joined physical UUIDs.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DISABLE_CONTROL",
    "CUDA_OVERSUBSCRIBE",
    "CUDA_TASK_PRIORITY",
    "GPU_CORE_UTILIZATION_POLICY",
    "HOOK_PATH",
    "LIBCUDA_LOG_LEVEL",
    "MEMORY_LIMIT_SUFFIX",
    "NVIDIA_VISIBLE_DEVICES",
    "memory_limit",
]

NVIDIA_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
CUDA_DEVICE_MEMORY_LIMIT: Final = "CUDA_DEVICE_MEMORY_LIMIT"  # global; per device: memory_limit(i)
CUDA_DEVICE_SM_LIMIT: Final = "CUDA_DEVICE_SM_LIMIT"
CUDA_DEVICE_MEMORY_SHARED_CACHE: Final = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
CUDA_OVERSUBSCRIBE: Final = "CUDA_OVERSUBSCRIBE"
CUDA_TASK_PRIORITY: Final = "CUDA_TASK_PRIORITY"
CUDA_DISABLE_CONTROL: Final = "CUDA_DISABLE_CONTROL"  # read from the pod spec, never set: no ld.so.preload
GPU_CORE_UTILIZATION_POLICY: Final = "GPU_CORE_UTILIZATION_POLICY"
LIBCUDA_LOG_LEVEL: Final = "LIBCUDA_LOG_LEVEL"
HOOK_PATH: Final = "HOOK_PATH"  # the device plugin's own: where libvgpu.so lives on the host (/usr/local)

MEMORY_LIMIT_SUFFIX: Final = "m"  # MiB, as HAMi writes it


def memory_limit(index: int) -> str:
    """``CUDA_DEVICE_MEMORY_LIMIT_<index>``: the limit of the container's ``index``-th device."""
    if index < 0:
        raise ValueError(f"device index {index} is negative")
    return f"{CUDA_DEVICE_MEMORY_LIMIT}_{index}"
