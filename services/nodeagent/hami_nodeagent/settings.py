"""The node agent's configuration: flags, then ``HAMI_*`` variables (see ``hami-nodeagent --help``)."""

from __future__ import annotations

from dataclasses import dataclass

from hami_common.allocation import NodeAllocationConfig
from hami_common.errors import InvalidInput
from hami_common.inventory import KINDS, NodeDeviceConfig
from hami_common.kube import KubeSettings
from hami_common.settings import BusSettings, setting
from hami_common.staging import DEFAULT_STAGING_DIR

__all__ = ["NodeAgentSettings"]


@dataclass(frozen=True)
class NodeAgentSettings(BusSettings, KubeSettings):
    """The HAMi node agent: GPU discovery and registration, placement pre-staging, usage from cache files."""

    node_name: str = setting("", "name of this node (set from the downward API: spec.nodeName)")
    inventory: str = setting("", "GPU discovery backend, chosen explicitly: nvml or fake")
    fake_inventory: str = setting("", "YAML file declaring the GPUs per node (inventory=fake)")
    device_split_count: int = setting(10, "deviceSplitCount: vGPU slots per physical GPU")
    device_memory_scaling: float = setting(1.0, "deviceMemoryScaling: registered memory = real MiB × factor")
    device_core_scaling: float = setting(1.0, "deviceCoreScaling: registered cores = factor × 100")
    preconfigured_device_memory: int = setting(0, "MiB to register when the driver cannot report memory")
    node_config_file: str = setting("", "HAMi's config.json with per-node overrides (nodeconfig); empty: none")
    topology_score: bool = setting(False, "also write hami.io/node-nvidia-score (ENABLE_TOPOLOGY_SCORE)")
    register_interval: float = setting(30.0, "seconds between full registration checks against the node")
    health_interval: float = setting(5.0, "seconds between health polls; a change is registered at once")
    staging_dir: str = setting(DEFAULT_STAGING_DIR, "node-local staging store shared with the device plugin")
    hook_path: str = setting("/usr/local", "HOOK_PATH: libvgpu.so and the containers' caches are under <hook>/vgpu")
    gpu_core_policy: str = setting("", "gpuCorePolicy passed to containers: default, force or disable")
    disable_core_limit: bool = setting(False, "disableCoreLimit: GPU_CORE_UTILIZATION_POLICY=disable")
    libcuda_log_level: str = setting("", "LIBCUDA_LOG_LEVEL for containers (empty: not set)")
    cdi_kind: str = setting("", "also answer CDI device names <kind>=<uuid> (e.g. nvidia.com/gpu)")
    placement_ack_wait: float = setting(30.0, "seconds before an unacknowledged placement is delivered again")
    orphan_grace: float = setting(60.0, "seconds a staged pod may stay unseen by the pod watch before removal")
    usage_interval: float = setting(5.0, "seconds between scans of the containers' cache files")
    cache_dir_grace: float = setting(300.0, "seconds before the cache directory of a vanished pod is removed")
    priority_feedback: bool = setting(True, "write recent_kernel/utilization_switch back like HAMi's monitor")

    def __post_init__(self) -> None:
        """What ``load`` cannot check field by field; InvalidInput (exit 2 from ``main``) says what is wrong."""
        if not self.node_name:
            raise InvalidInput("node name is required (--node-name or HAMI_NODE_NAME)")
        if self.inventory not in KINDS:
            raise InvalidInput(f"--inventory must be chosen explicitly: one of {', '.join(KINDS)}")
        for name in ("register_interval", "health_interval", "usage_interval", "placement_ack_wait"):
            if getattr(self, name) <= 0:
                raise InvalidInput(f"--{name.replace('_', '-')} must be positive")
        self.device_config()

    def device_config(self) -> NodeDeviceConfig:
        return NodeDeviceConfig(
            split_count=self.device_split_count,
            memory_scaling=self.device_memory_scaling,
            core_scaling=self.device_core_scaling,
            preconfigured_memory_mib=self.preconfigured_device_memory,
        )

    def allocation_config(self, device: NodeDeviceConfig) -> NodeAllocationConfig:
        return NodeAllocationConfig(
            hook_path=self.hook_path,
            device_memory_scaling=device.memory_scaling,
            core_policy=self.gpu_core_policy,
            disable_core_limit=self.disable_core_limit,
            libcuda_log_level=self.libcuda_log_level,
            cdi_kind=self.cdi_kind,
        )
