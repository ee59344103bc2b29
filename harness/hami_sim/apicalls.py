"""What kube-apiserver counted itself: requests by verb and resource, and the admission webhooks it called.

Read from its ``/metrics`` (``apiserver_request_total`` and ``apiserver_admission_webhook_request_total``),
so a benchmark reports the control plane's work per pod as the apiserver saw it, whoever the client was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["WRITE_VERBS", "ApiCalls", "api_calls", "per_pod"]

# kube-apiserver's verb label is the HTTP method for writes (POST is a create, PUT an update), APPLY for
# server-side apply; reads are GET, LIST, WATCH
WRITE_VERBS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY"})
_REQUESTS: Final = "apiserver_request_total"
_WEBHOOKS: Final = "apiserver_admission_webhook_request_total"


class ApiCalls:
    """Counts so far: ``requests`` keyed ``"VERB resource[/subresource]"``, ``webhooks`` keyed
    ``"webhook-name OPERATION"``. Subtracting two readings gives what happened between them."""

    def __init__(self, requests: Mapping[str, float], webhooks: Mapping[str, float]) -> None:
        self.requests = dict(requests)
        self.webhooks = dict(webhooks)

    def __sub__(self, earlier: ApiCalls) -> ApiCalls:
        return ApiCalls(
            {k: v - earlier.requests.get(k, 0.0) for k, v in self.requests.items() if v > earlier.requests.get(k, 0.0)},
            {k: v - earlier.webhooks.get(k, 0.0) for k, v in self.webhooks.items() if v > earlier.webhooks.get(k, 0.0)},
        )

    @property
    def writes(self) -> float:
        return sum(v for k, v in self.requests.items() if k.split(" ", 1)[0] in WRITE_VERBS)


def api_calls(metrics_text: str) -> ApiCalls:
    """The counters of one ``/metrics`` reading (dry runs left out: they change nothing)."""
    requests: dict[str, float] = {}
    webhooks: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == _REQUESTS and not labels.get("dry_run"):
                resource = labels.get("resource", "")
                if labels.get("subresource"):
                    resource += "/" + labels["subresource"]
                key = f"{labels.get('verb', '?')} {resource or labels.get('component', '?')}"
                requests[key] = requests.get(key, 0.0) + sample.value
            elif sample.name == _WEBHOOKS:
                key = f"{labels.get('name', '?')} {labels.get('operation', '?')}"
                webhooks[key] = webhooks.get(key, 0.0) + sample.value
    return ApiCalls(requests, webhooks)


def per_pod(counts: Mapping[str, float], pods: int) -> dict[str, float]:
    """Each count over ``pods``, largest first, rounded for a report."""
    return {k: round(v / pods, 2) for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if v}
