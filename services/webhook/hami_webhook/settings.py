"""The webhook's settings: flags, then ``HAMI_*`` variables (``hami-webhook --help`` lists them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from hami_common.connections import ConnectionLimits
from hami_common.deviceconfig import DeviceConfigSettings, overridden
from hami_common.kube import KubeSettings
from hami_common.mtls import ClientCaSettings
from hami_common.settings import BusSettings, setting
from hami_webhook.admission import AdmissionPolicy

__all__ = ["DEFAULT_SYSTEM_USERS", "WebhookSettings"]

# The ServiceAccounts of deploy/kustomize/base/rbac that write scheduler-owned annotations: the scheduler pod
# (the extender) and the node pod (node agent and allocator). The real kube-apiserver sends their UPDATEs
# through this webhook too.
DEFAULT_SYSTEM_USERS: Final = (
    "system:serviceaccount:hami-system:hami-scheduler",
    "system:serviceaccount:hami-system:hami-node",
)
MAX_BODY_BYTES: Final = 7 * 1024 * 1024  # controller-runtime's limit, which HAMi's webhook has


@dataclass(frozen=True, slots=True)
class WebhookSettings(KubeSettings, BusSettings, DeviceConfigSettings, ClientCaSettings):
    """The mutating admission webhook: HAMi's rules, quota pre-check, reserved-annotation guard."""

    host: str = setting("0.0.0.0", "address to listen on")
    port: int = setting(8443, "HTTPS port of POST /webhook")
    tls_cert_file: str = setting("", "PEM certificate chain; empty: plain HTTP (local development only)")
    tls_key_file: str = setting("", "PEM private key of the certificate (empty: it is in the certificate file)")
    tls_reload_seconds: float = setting(10.0, "how often the certificate files are checked for changes")
    scheduler_name: str = setting("hami-scheduler", "schedulerName set on GPU pods (HAMi's --scheduler-name)")
    force_overwrite_default_scheduler: bool = setting(True, "take over pods that name default-scheduler")
    # unset (None): the device config's nvidia value (--device-config-file), else HAMi's default shown
    default_memory: int | None = setting(None, "MiB for a GPU request without memory (defaultMemory; 0: whole card)")
    default_cores: int | None = setting(None, "core percent for a GPU request without cores (defaultCores; 0)")
    default_gpu_num: int | None = setting(None, "GPU count added when only memory or cores are in limits (1)")
    memory_factor: int | None = setting(None, "multiplier of requested MiB and of memory quota (memoryFactor; 1)")
    overwrite_env: bool | None = setting(None, "give containers without a GPU NVIDIA_VISIBLE_DEVICES=none (false)")
    gpu_core_policy: str | None = setting(
        None, "GPU_CORE_UTILIZATION_POLICY for every container: default, force or disable (default)"
    )
    runtime_class_name: str | None = setting(None, "runtimeClassName set on GPU pods that have none (empty: none)")
    system_users: tuple[str, ...] = setting(DEFAULT_SYSTEM_USERS, "users that may write scheduler-owned annotations")
    disable_control_label: str = setting(
        "", "namespace label (key or key=value) that lets GPU containers keep CUDA_DISABLE_CONTROL; empty: none"
    )
    dra: bool = setting(
        False, "DRA mode (docs/dra.md): NVIDIA requests become ResourceClaimTemplates for HAMi's DRA driver"
    )
    watch_cluster: bool = setting(True, "watch ResourceQuotas, GPU pods and namespaces (off: no quota check)")
    publish_events: bool = setting(True, "publish an AdmissionEvent per admission on NATS (best effort)")
    publish_timeout: float = setting(0.5, "seconds one event publish may take before it is dropped")
    event_queue: int = setting(4096, "admission events buffered while NATS is slow or down; more are dropped")
    quota_announce_seconds: float = setting(1.0, "how often changed namespace quotas are published for metrics")
    quota_refresh_seconds: float = setting(30.0, "how often every namespace quota is published again")
    max_body_bytes: int = setting(MAX_BODY_BYTES, "largest AdmissionReview accepted")
    max_connections: int = setting(1024, "open connections at most; at the cap the oldest idle one is dropped")
    read_timeout: float = setting(10.0, "seconds a connection has to deliver a whole request (after TLS or an answer)")
    handshake_timeout: float = setting(5.0, "seconds a new connection has to finish its TLS handshake")
    keep_alive_timeout: float = setting(5.0, "seconds an idle keep-alive connection is kept (whole seconds)")
    max_header_bytes: int = setting(64 * 1024, "largest request head (request line and headers) accepted")

    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(
            max_connections=self.max_connections,
            read_timeout=self.read_timeout,
            handshake_timeout=self.handshake_timeout,
            keep_alive_timeout=self.keep_alive_timeout,
            max_header_bytes=self.max_header_bytes,
        )

    def policy(self) -> AdmissionPolicy:
        """The device config's nvidia knobs and resource names, with every flag that was given on top."""
        device = self.device_config()
        flags = {
            "default_memory": self.default_memory,
            "default_cores": self.default_cores,
            "default_gpu_num": self.default_gpu_num,
            "memory_factor": self.memory_factor,
        }
        return AdmissionPolicy(
            resources=overridden(device.resources, flags),
            scheduler_name=self.scheduler_name,
            force_overwrite_default_scheduler=self.force_overwrite_default_scheduler,
            overwrite_env=device.overwrite_env if self.overwrite_env is None else self.overwrite_env,
            gpu_core_policy=device.gpu_core_policy if self.gpu_core_policy is None else self.gpu_core_policy,
            runtime_class_name=device.runtime_class_name
            if self.runtime_class_name is None
            else self.runtime_class_name,
            system_users=frozenset(self.system_users),
            families=device.families,
        )
