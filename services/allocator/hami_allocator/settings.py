"""The allocator's settings: flags, then ``HAMI_*`` environment variables (hami_common.settings)."""

from __future__ import annotations

from dataclasses import dataclass

from hami_common.allocation import NodeAllocationConfig
from hami_common.deviceconfig import NodeConfigSettings
from hami_common.deviceplugin.rpc import DEVICE_PLUGIN_PATH
from hami_common.grants import GrantSettings
from hami_common.inventory import NodeDeviceConfig
from hami_common.kube import KubeSettings
from hami_common.settings import BusSettings, setting
from hami_common.staging import DEFAULT_STAGING_DIR

__all__ = ["AllocatorSettings"]


@dataclass(frozen=True)
class AllocatorSettings(BusSettings, KubeSettings, GrantSettings, NodeConfigSettings):
    """The HAMi-compatible kubelet device plugin for NVIDIA GPUs.

    A knob left unset (None, or an empty resource name) comes from ``--device-config-file`` and this node's
    ``nodeconfig`` entry, as the node agent takes it, else HAMi's default shown in its help.
    """

    node_name: str = setting("", "this node's name (the DaemonSet passes spec.nodeName)")
    plugin_dir: str = setting(DEVICE_PLUGIN_PATH, "the kubelet's device-plugin directory (holds kubelet.sock)")
    socket_name: str = setting("nvidia-gpu.sock", "file name of this plugin's socket in the plugin directory")
    resource_name: str = setting("", "extended resource advertised (empty: resourceCountName, nvidia.com/gpu)")
    device_split_count: int | None = setting(None, "virtual devices advertised per physical GPU (deviceSplitCount; 10)")
    inventory: str = setting("", "GPU discovery, as the node agent's: nvml or fake (empty: use --gpus)")
    fake_inventory: str = setting("", "YAML file declaring the GPUs per node (inventory=fake)")
    inventory_poll: float = setting(5.0, "seconds between two reads of GPU discovery (health changes)")
    gpus: tuple[str, ...] = setting((), "declared GPUs, 'UUID' or 'UUID:NUMA', comma separated (no discovery)")
    numa_topology: bool | None = setting(None, "attach each GPU's NUMA node to its devices (enableNumaTopology; off)")
    preferred_allocation: bool | None = setting(
        None, "offer GetPreferredAllocation to the kubelet (enablegetpreferredallocation; on)"
    )
    pod_resources_socket: str = setting(
        "", "the kubelet's PodResources socket, asked which pod each Allocate is for (empty: guessed, as HAMi does)"
    )
    staging_dir: str = setting(DEFAULT_STAGING_DIR, "node-local staging store shared with the node agent")
    hook_path: str = setting("/usr/local", "host directory holding vgpu/libvgpu.so (HAMi's HOOK_PATH)")
    libvgpu: str = setting("", "host file mounted as libvgpu.so, e.g. a versioned one (empty: $HOOK/vgpu/libvgpu.so)")
    limits_dir: str = setting("", "host directory of the per-container limits files (empty: $HOOK/vgpu/limits)")
    device_memory_scaling: float | None = setting(None, "deviceMemoryScaling; above 1 sets CUDA_OVERSUBSCRIBE (1)")
    core_policy: str | None = setting(None, "gpuCorePolicy: default, force or disable (default)")
    disable_core_limit: bool | None = setting(None, "set GPU_CORE_UTILIZATION_POLICY=disable in every container")
    libcuda_log_level: str | None = setting(None, "LIBCUDA_LOG_LEVEL given to every container (empty: unset)")
    cdi_kind: str = setting("", "answer CDI device names '<kind>=<uuid>' too (e.g. nvidia.com/gpu)")
    use_apiserver: bool = setting(True, "fall back to pod annotations and record allocations in the apiserver")
    use_bus: bool = setting(True, "publish allocation results on NATS")
    watch_interval: float = setting(1.0, "seconds between checks for a kubelet restart")
    mig_reclaim_interval: float = setting(30.0, "MIG mode: seconds between two passes destroying unowned instances")
    mig_reclaim_grace: float = setting(
        60.0, "MIG mode: seconds an instance no live pod owns may live before it is destroyed (a racing Allocate's)"
    )
    register_timeout: float = setting(10.0, "seconds one Register call to the kubelet may take")
    vendor_host_root: str = setting(
        "/", "fake inventory: where other vendors' plugins write their host files (Hygon's vdev conf)"
    )

    def node_config(self) -> NodeDeviceConfig:
        """The same per-node values the node agent registers with, so the kubelet's count agrees."""
        return self.node_device_config(
            self.node_name,
            {
                "split_count": self.device_split_count,
                "memory_scaling": self.device_memory_scaling,
                "libcuda_log_level": self.libcuda_log_level,
                "numa_topology": self.numa_topology,
                "preferred_allocation": self.preferred_allocation,
            },
        )

    def advertised_resource(self) -> str:
        return self.resource_name or self.device_config().resources.count_name

    def allocation_config(self, node: NodeDeviceConfig) -> NodeAllocationConfig:
        device = self.device_config()
        return NodeAllocationConfig(
            hook_path=self.hook_path,
            libvgpu_host_path=self.libvgpu,
            limits_host_dir=self.limits_dir,
            device_memory_scaling=node.memory_scaling,
            core_policy=device.gpu_core_policy if self.core_policy is None else self.core_policy,
            disable_core_limit=device.disable_core_limit
            if self.disable_core_limit is None
            else self.disable_core_limit,
            libcuda_log_level=node.libcuda_log_level,
            cdi_kind=self.cdi_kind,
        )
