"""The local cluster behind ``hami up``, the end-to-end tests and the benchmark.

* :class:`LocalCluster` — NATS, the API emulator, the webhook, the extender, the metrics service, N
  simulated nodes and the kube-scheduler stand-in; ``submit`` admits a pod through the webhook.
* :class:`StackConfig` — its size and where its files go; :func:`inventory_document` the nodes' GPUs.
* :mod:`~hami_sim.stack.chaos` — disruptions under load and the audit of what they left.
"""

from hami_sim.admission import AdmissionDenied, Admitter
from hami_sim.stack._cluster import LocalCluster
from hami_sim.stack._config import MIG_TAINT, StackConfig, gpu_uuid, inventory_document, mig_node_name, node_name
from hami_sim.stack._node import Admitted, SimNode

__all__ = [
    "MIG_TAINT",
    "AdmissionDenied",
    "Admitted",
    "Admitter",
    "LocalCluster",
    "SimNode",
    "StackConfig",
    "gpu_uuid",
    "inventory_document",
    "mig_node_name",
    "node_name",
]
