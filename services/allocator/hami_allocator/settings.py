"""The allocator's settings: flags, then ``HAMI_*`` environment variables (hami_common.settings)."""

from __future__ import annotations

from dataclasses import dataclass

from hami_common.deviceplugin.rpc import DEVICE_PLUGIN_PATH
from hami_common.grants import GrantSettings
from hami_common.kube import KubeSettings
from hami_common.resources import GPU
from hami_common.settings import BusSettings, setting
from hami_common.staging import DEFAULT_STAGING_DIR

__all__ = ["AllocatorSettings"]


@dataclass(frozen=True)
class AllocatorSettings(BusSettings, KubeSettings, GrantSettings):
    """The HAMi-compatible kubelet device plugin for NVIDIA GPUs."""

    node_name: str = setting("", "this node's name (the DaemonSet passes spec.nodeName)")
    plugin_dir: str = setting(DEVICE_PLUGIN_PATH, "the kubelet's device-plugin directory (holds kubelet.sock)")
    socket_name: str = setting("nvidia-gpu.sock", "file name of this plugin's socket in the plugin directory")
    resource_name: str = setting(GPU, "extended resource this plugin advertises")
    device_split_count: int = setting(10, "virtual devices advertised per physical GPU (deviceSplitCount)")
    inventory: str = setting("", "GPU discovery, as the node agent's: nvml or fake (empty: use --gpus)")
    fake_inventory: str = setting("", "YAML file declaring the GPUs per node (inventory=fake)")
    inventory_poll: float = setting(5.0, "seconds between two reads of GPU discovery (health changes)")
    gpus: tuple[str, ...] = setting((), "declared GPUs, 'UUID' or 'UUID:NUMA', comma separated (no discovery)")
    numa_topology: bool = setting(False, "attach each GPU's NUMA node to its advertised devices")
    preferred_allocation: bool = setting(True, "offer GetPreferredAllocation to the kubelet")
    staging_dir: str = setting(DEFAULT_STAGING_DIR, "node-local staging store shared with the node agent")
    hook_path: str = setting("/usr/local", "host directory holding vgpu/libvgpu.so (HAMi's HOOK_PATH)")
    libvgpu: str = setting("", "host file mounted as libvgpu.so, e.g. a versioned one (empty: $HOOK/vgpu/libvgpu.so)")
    limits_dir: str = setting("", "host directory of the per-container limits files (empty: $HOOK/vgpu/limits)")
    device_memory_scaling: float = setting(1.0, "deviceMemoryScaling; above 1 sets CUDA_OVERSUBSCRIBE")
    core_policy: str = setting("default", "gpuCorePolicy: default, force or disable")
    disable_core_limit: bool = setting(False, "set GPU_CORE_UTILIZATION_POLICY=disable in every container")
    libcuda_log_level: str = setting("", "LIBCUDA_LOG_LEVEL given to every container (empty: unset)")
    cdi_kind: str = setting("", "answer CDI device names '<kind>=<uuid>' too (e.g. nvidia.com/gpu)")
    use_apiserver: bool = setting(True, "fall back to pod annotations and record allocations in the apiserver")
    use_bus: bool = setting(True, "publish allocation results on NATS")
    watch_interval: float = setting(1.0, "seconds between checks for a kubelet restart")
    register_timeout: float = setting(10.0, "seconds one Register call to the kubelet may take")
