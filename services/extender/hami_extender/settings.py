"""The extender's settings: flags, then ``HAMI_*`` environment variables (hami_common.settings)."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from hami_common.deviceconfig import DeviceConfigSettings, overridden
from hami_common.grants import GrantSettings
from hami_common.kube import KubeSettings
from hami_common.mtls import ClientCaSettings
from hami_common.resources import ResourceConfig
from hami_common.scheduling import DEFAULT_SCHEDULER_NAME, SchedulerDefaults
from hami_common.settings import BusSettings, setting

__all__ = ["ExtenderSettings"]


@dataclass(frozen=True, slots=True)
class ExtenderSettings(BusSettings, GrantSettings, DeviceConfigSettings, ClientCaSettings):
    """HAMi-compatible kube-scheduler extender: /filter, /bind, /prioritize."""

    http_host: str = setting("127.0.0.1", "address the HTTP API listens on")
    http_port: int = setting(8080, "port of the HTTP API")
    tls_cert_file: str = setting("", "PEM certificate; with a key, the API is served over HTTPS")
    tls_key_file: str = setting("", "PEM private key of the certificate")
    health_port: int = setting(0, "plain-HTTP port answering GET /healthz only, for the kubelet's probes (0: none)")
    health_host: str = setting("", "address of the probe port (empty: every address)")
    health_max_connections: int = setting(
        64, "open probe-port connections at most; at the cap the oldest one not being answered is dropped"
    )
    health_read_timeout: float = setting(5.0, "seconds a probe-port connection has to deliver a whole request")
    bearer_token: str = setting("", "if set, requests must carry 'Authorization: Bearer <token>'")
    kubeconfig: str = setting("", "kubeconfig path; empty: in-cluster config, else $KUBECONFIG")
    kube_context: str = setting("", "kubeconfig context (empty: the current one)")
    kube_timeout: float = setting(10.0, "seconds each API request may take")
    kube_watch_seconds: int = setting(300, "seconds a watch stays open before it is renewed")
    scheduler_name: str = setting(
        DEFAULT_SCHEDULER_NAME,
        "the kube-scheduler profile served: only its pods (spec.schedulerName) are bound; the Events' component",
    )
    node_scheduler_policy: str = setting("binpack", "default node policy: binpack or spread")
    gpu_scheduler_policy: str = setting("spread", "default GPU policy: binpack, spread, topology-aware, mutex, numa")
    node_label_selector: str = setting("", "only nodes matching this label selector are watched")
    # unset (None): the device config's nvidia value (--device-config-file), else HAMi's default shown
    memory_factor: int | None = setting(None, "nvidia memoryFactor: MiB requests are multiplied by it (1)")
    default_memory: int | None = setting(None, "nvidia defaultMemory in MiB (0: the whole card)")
    default_cores: int | None = setting(None, "nvidia defaultCores (0)")
    leader_elect: bool = setting(False, "hold a Lease and serve /filter and /bind only while leading")
    leader_follow: bool = setting(
        False,
        "with --leader-elect: do not campaign, lead while kube-scheduler's Lease (--lease-name) is held by "
        "'<identity>_...' (HAMi's rule: the kube-scheduler replica in this pod)",
    )
    lease_name: str = setting("hami-scheduler", "name of the leader-election Lease")
    lease_namespace: str = setting("kube-system", "namespace of the leader-election Lease")
    lease_duration: int = setting(15, "seconds a Lease holder is trusted without renewing")
    identity: str = setting("", "leader-election identity (empty: the host name)")
    node_lock_timeout: float = setting(300.0, "seconds after which a node hand-off (HAMi lock) is taken over")
    handoff_wait: float = setting(10.0, "seconds a bind waits for another pod's hand-off on the same node")
    sync_wait: float = setting(5.0, "seconds a request waits for the caches' first sync")
    node_pass_interval: float = setting(15.0, "seconds between passes that judge node handshakes again (HAMi: 15)")
    publish_timeout: float = setting(2.0, "seconds a placement publish to NATS may take")
    placement_replicas: int = setting(1, "copies of the placement stream a NATS cluster keeps (3 for 3 servers)")
    success_events: bool = setting(
        False,
        "record HAMi's FilteringSucceed and BindingSucceed Events as well (two apiserver writes per pod; "
        "kube-scheduler's own Scheduled event already records each placement)",
    )
    role_label: bool = setting(
        False, "label this pod (the identity, in the lease namespace) hami.io/scheduler-role=leader|follower"
    )

    def kube(self) -> KubeSettings:
        return KubeSettings(
            kubeconfig=self.kubeconfig,
            kube_context=self.kube_context,
            kube_timeout=self.kube_timeout,
            kube_watch_seconds=self.kube_watch_seconds,
        )

    def policies(self) -> SchedulerDefaults:
        return SchedulerDefaults(
            node_policy=self.node_scheduler_policy,
            gpu_policy=self.gpu_scheduler_policy,
            memory_factor=self.resource_config().memory_factor,
        )

    def resource_config(self) -> ResourceConfig:
        """The device config's resource names and nvidia knobs, with every flag that was given on top."""
        flags = {
            "memory_factor": self.memory_factor,
            "default_memory": self.default_memory,
            "default_cores": self.default_cores,
        }
        return overridden(self.device_config().resources, flags)

    def candidate(self) -> str:
        return self.identity or socket.gethostname()
