"""The node agent's configuration: flags, then ``HAMI_*`` variables (see ``hami-nodeagent --help``)."""

from __future__ import annotations

from dataclasses import dataclass

from hami_common.allocation import NodeAllocationConfig
from hami_common.deviceconfig import NodeConfigSettings
from hami_common.errors import InvalidInput
from hami_common.inventory import KINDS, NodeDeviceConfig
from hami_common.kube import KubeSettings
from hami_common.settings import BusSettings, setting
from hami_common.staging import DEFAULT_STAGING_DIR

__all__ = ["NodeAgentSettings"]


@dataclass(frozen=True)
class NodeAgentSettings(BusSettings, KubeSettings, NodeConfigSettings):
    """The HAMi node agent: GPU discovery and registration, placement pre-staging, usage from cache files.

    A knob left unset (None) comes from ``--device-config-file`` and this node's ``nodeconfig`` entry, as the
    allocator takes it, else HAMi's default shown in its help.
    """

    node_name: str = setting("", "name of this node (set from the downward API: spec.nodeName)")
    inventory: str = setting("", "GPU discovery backend, chosen explicitly: nvml or fake")
    fake_inventory: str = setting("", "YAML file declaring the GPUs per node (inventory=fake)")
    device_split_count: int | None = setting(None, "deviceSplitCount: vGPU slots per physical GPU (10)")
    device_memory_scaling: float | None = setting(None, "deviceMemoryScaling: registered MiB = real MiB × factor (1)")
    device_core_scaling: float | None = setting(None, "deviceCoreScaling: registered cores = factor × 100 (1)")
    preconfigured_device_memory: int | None = setting(None, "MiB to register when the driver cannot report it (0)")
    topology_score: bool = setting(False, "also write hami.io/node-nvidia-score (ENABLE_TOPOLOGY_SCORE)")
    register_interval: float = setting(30.0, "seconds between full registration checks against the node")
    health_interval: float = setting(5.0, "seconds between health polls; a change is registered at once")
    staging_dir: str = setting(DEFAULT_STAGING_DIR, "node-local staging store shared with the device plugin")
    hook_path: str = setting("/usr/local", "HOOK_PATH: libvgpu.so and the containers' caches are under <hook>/vgpu")
    gpu_core_policy: str | None = setting(None, "gpuCorePolicy passed to containers: default, force or disable")
    disable_core_limit: bool | None = setting(None, "disableCoreLimit: GPU_CORE_UTILIZATION_POLICY=disable (off)")
    libcuda_log_level: str | None = setting(None, "LIBCUDA_LOG_LEVEL for containers (empty: not set)")
    cdi_kind: str = setting("", "also answer CDI device names <kind>=<uuid> (e.g. nvidia.com/gpu)")
    placement_ack_wait: float = setting(30.0, "seconds before an unacknowledged placement is delivered again")
    orphan_grace: float = setting(60.0, "seconds a staged pod may stay unseen by the pod watch before removal")
    usage_interval: float = setting(5.0, "seconds between scans of the containers' cache files")
    cache_dir_grace: float = setting(300.0, "seconds before the cache directory of a vanished pod is removed")
    priority_feedback: bool = setting(True, "write recent_kernel/utilization_switch back like HAMi's monitor")
    dra: bool = setting(False, "DRA mode (docs/dra.md): also publish this node's GPUs as ResourceSlices")

    def __post_init__(self) -> None:
        """What ``load`` cannot check field by field; InvalidInput (exit 2 from ``main``) says what is wrong."""
        super().__post_init__()  # reads and checks the device config and the node config
        if not self.node_name:
            raise InvalidInput("node name is required (--node-name or HAMI_NODE_NAME)")
        if self.inventory not in KINDS:
            raise InvalidInput(f"--inventory must be chosen explicitly: one of {', '.join(KINDS)}")
        for name in ("register_interval", "health_interval", "usage_interval", "placement_ack_wait"):
            if getattr(self, name) <= 0:
                raise InvalidInput(f"--{name.replace('_', '-')} must be positive")
        self.node_config()

    def node_config(self) -> NodeDeviceConfig:
        """This node's entry over the device config, then the flags given: the allocator's values too."""
        return self.node_device_config(
            self.node_name,
            {
                "split_count": self.device_split_count,
                "memory_scaling": self.device_memory_scaling,
                "core_scaling": self.device_core_scaling,
                "preconfigured_memory_mib": self.preconfigured_device_memory,
                "libcuda_log_level": self.libcuda_log_level,
            },
        )

    def allocation_config(self, device: NodeDeviceConfig) -> NodeAllocationConfig:
        config = self.device_config()
        return NodeAllocationConfig(
            hook_path=self.hook_path,
            device_memory_scaling=device.memory_scaling,
            core_policy=config.gpu_core_policy if self.gpu_core_policy is None else self.gpu_core_policy,
            disable_core_limit=(
                config.disable_core_limit if self.disable_core_limit is None else self.disable_core_limit
            ),
            libcuda_log_level=device.libcuda_log_level,
            cdi_kind=self.cdi_kind,
        )
