"""The aggregator's configuration: flags, then ``HAMI_*`` environment variables, then these defaults."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hami_common.errors import InvalidInput
from hami_common.settings import BusSettings, setting
from hami_metrics.history import HistoryLimits
from hami_metrics.staleness import Retention
from hami_metrics.state import NS_PER_S

__all__ = ["MetricsSettings"]


@dataclass(frozen=True, slots=True)
class MetricsSettings(BusSettings):
    """HAMi metrics aggregator: the cluster's GPU state from the bus, as Prometheus metrics."""

    service_name: str = setting("hami-metrics", "name this process reports to NATS and tracing")
    http_host: str = setting("0.0.0.0", "address to serve /metrics and /healthz on")
    http_port: int = setting(31993, "port to serve /metrics and /healthz on (HAMi's monitor NodePort)")
    legacy_metrics: bool = setting(False, "also emit HAMi's legacy metric names (GPUDeviceMemoryLimit, ...)")
    node_staleness_s: float = setting(90.0, "drop a node's series after it reported nothing for this long")
    usage_staleness_s: float = setting(30.0, "drop a container's usage series after this long without a sample")
    admission_horizon_s: float = setting(900.0, "forget an admitted pod that was not bound within this long")
    admission_namespace_staleness_s: float = setting(
        3600.0, 'a namespace without an admission this long counts under namespace="_other" (deleted ones too)'
    )
    metrics_token: str = setting("", "bearer token required on /metrics (empty: no authentication)")
    metrics_token_file: str = setting("", "file holding the bearer token; read once at start, wins over the flag")
    tls_cert_file: str = setting("", "PEM certificate: serve HTTPS when set (with --tls-key-file)")
    tls_key_file: str = setting("", "PEM private key of --tls-cert-file")
    shard_index: int = setting(0, "this instance's shard, 0 <= index < --shard-count")
    shard_count: int = setting(1, "aggregators splitting the nodes between them by a hash of the node name")
    history_interval_s: float = setting(30.0, "the web page's charts: seconds between two samples of each card and pod")
    history_hours: float = setting(2.0, "the web page's charts: hours of samples kept (in memory, oldest dropped)")
    history_max_series: int = setting(20000, "the web page's charts: at most this many cards and pods have a history")

    def retention(self) -> Retention:
        return Retention(
            node_staleness_ns=int(self.node_staleness_s * NS_PER_S),
            usage_staleness_ns=int(self.usage_staleness_s * NS_PER_S),
            admission_horizon_ns=int(self.admission_horizon_s * NS_PER_S),
            admission_namespace_staleness_ns=int(self.admission_namespace_staleness_s * NS_PER_S),
        )

    def history_limits(self) -> HistoryLimits:
        interval_ns = int(self.history_interval_s * NS_PER_S)
        return HistoryLimits(
            interval_ns=interval_ns,
            capacity=max(1, int(self.history_hours * 3600 * NS_PER_S) // interval_ns),
            max_series=self.history_max_series,
            # a card or pod gone quiet for as long as a node may be (then it is gone from the state too)
            forget_ns=int(self.node_staleness_s * NS_PER_S),
        )

    def token(self) -> str:
        """The bearer token /metrics requires, or "" for none; a named file that cannot be read is an error."""
        if not self.metrics_token_file:
            return self.metrics_token
        try:
            return Path(self.metrics_token_file).read_text().strip()
        except OSError as err:
            raise InvalidInput(f"cannot read --metrics-token-file: {err}") from err

    def __post_init__(self) -> None:
        """Reject inconsistent settings when they are loaded (``load`` turns this into exit status 2)."""
        if self.shard_count < 1 or not 0 <= self.shard_index < self.shard_count:
            raise InvalidInput(f"shard {self.shard_index} of {self.shard_count}: need 0 <= index < count")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise InvalidInput("--tls-cert-file and --tls-key-file go together")
        if self.node_staleness_s <= 0 or self.usage_staleness_s <= 0 or self.admission_namespace_staleness_s <= 0:
            raise InvalidInput("staleness periods must be positive")
        if self.history_interval_s <= 0 or self.history_hours <= 0 or self.history_max_series < 0:
            raise InvalidInput("--history-interval-s and --history-hours must be positive, --history-max-series >= 0")
