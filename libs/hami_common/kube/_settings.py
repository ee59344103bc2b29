"""How a service reaches the Kubernetes API; services inherit these settings."""

from __future__ import annotations

from dataclasses import dataclass

from hami_common.kube._retry import Backoff
from hami_common.settings import setting

__all__ = ["KubeSettings"]


@dataclass(frozen=True)  # no slots: service settings combine bases by multiple inheritance
class KubeSettings:
    """How a service reaches the Kubernetes API."""

    kubeconfig: str = setting("", "kubeconfig path; empty: in-cluster config, else $KUBECONFIG or ~/.kube/config")
    kube_context: str = setting("", "kubeconfig context to use (empty: the current context)")
    kube_timeout: float = setting(10.0, "seconds each API request may take")
    kube_watch_seconds: int = setting(300, "seconds a watch stays open before it is renewed")
    kube_backoff_initial: float = setting(0.2, "first reconnect delay of a broken watch, in seconds")
    kube_backoff_max: float = setting(10.0, "longest reconnect delay of a broken watch, in seconds")
    kube_conflict_retries: int = setting(8, "attempts of a resourceVersion-guarded write before giving up")

    def watch_backoff(self) -> Backoff:
        """The reconnect backoff of watch caches, from ``kube_backoff_initial`` / ``kube_backoff_max``."""
        return Backoff(initial=self.kube_backoff_initial, cap=self.kube_backoff_max)
