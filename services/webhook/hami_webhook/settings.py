"""The webhook's settings: flags, then ``HAMI_*`` variables (``hami-webhook --help`` lists them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from hami_common.kube import KubeSettings
from hami_common.resources import ResourceConfig
from hami_common.settings import BusSettings, setting
from hami_webhook.admission import AdmissionPolicy
from hami_webhook.connections import ConnectionLimits

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
class WebhookSettings(KubeSettings, BusSettings):
    """The mutating admission webhook: HAMi's rules, quota pre-check, reserved-annotation guard."""

    host: str = setting("0.0.0.0", "address to listen on")
    port: int = setting(8443, "HTTPS port of POST /webhook")
    tls_cert_file: str = setting("", "PEM certificate chain; empty: plain HTTP (local development only)")
    tls_key_file: str = setting("", "PEM private key of the certificate (empty: it is in the certificate file)")
    tls_reload_seconds: float = setting(10.0, "how often the certificate files are checked for changes")
    scheduler_name: str = setting("hami-scheduler", "schedulerName set on GPU pods (HAMi's --scheduler-name)")
    force_overwrite_default_scheduler: bool = setting(True, "take over pods that name default-scheduler")
    default_memory: int = setting(0, "MiB for a GPU request without memory (0: the whole card)")
    default_cores: int = setting(0, "core percent for a GPU request without cores")
    default_gpu_num: int = setting(1, "nvidia.com/gpu added when only memory or cores are in limits")
    memory_factor: int = setting(1, "multiplier of requested MiB and of memory quota")
    overwrite_env: bool = setting(False, "give containers without a GPU NVIDIA_VISIBLE_DEVICES=none")
    gpu_core_policy: str = setting("default", "GPU_CORE_UTILIZATION_POLICY for every container (default/force/disable)")
    runtime_class_name: str = setting("", "runtimeClassName set on GPU pods that have none")
    system_users: tuple[str, ...] = setting(DEFAULT_SYSTEM_USERS, "users that may write scheduler-owned annotations")
    disable_control_label: str = setting(
        "", "namespace label (key or key=value) that lets GPU containers keep CUDA_DISABLE_CONTROL; empty: none"
    )
    watch_cluster: bool = setting(True, "watch ResourceQuotas, GPU pods and namespaces (off: no quota check)")
    publish_events: bool = setting(True, "publish an AdmissionEvent per admission on NATS (best effort)")
    publish_timeout: float = setting(0.5, "seconds one event publish may take before it is dropped")
    event_queue: int = setting(4096, "admission events buffered while NATS is slow or down; more are dropped")
    max_body_bytes: int = setting(MAX_BODY_BYTES, "largest AdmissionReview accepted")
    max_connections: int = setting(1024, "open connections at most; at the cap the oldest idle one is dropped")
    read_timeout: float = setting(10.0, "seconds a connection has to deliver a whole request (after TLS or an answer)")
    keep_alive_timeout: float = setting(5.0, "seconds an idle keep-alive connection is kept (whole seconds)")
    max_header_bytes: int = setting(64 * 1024, "largest request head (request line and headers) accepted")

    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(
            max_connections=self.max_connections,
            read_timeout=self.read_timeout,
            keep_alive_timeout=self.keep_alive_timeout,
            max_header_bytes=self.max_header_bytes,
        )

    def policy(self) -> AdmissionPolicy:
        return AdmissionPolicy(
            resources=ResourceConfig(
                default_memory=self.default_memory,
                default_cores=self.default_cores,
                default_gpu_num=self.default_gpu_num,
                memory_factor=self.memory_factor,
            ),
            scheduler_name=self.scheduler_name,
            force_overwrite_default_scheduler=self.force_overwrite_default_scheduler,
            overwrite_env=self.overwrite_env,
            gpu_core_policy=self.gpu_core_policy,
            runtime_class_name=self.runtime_class_name,
            system_users=frozenset(self.system_users),
        )
