"""The shipped manifests as the system under test: deploy/'s overlays rendered, applied and run here.

* :func:`prepare_tree`, :func:`render` — an overlay rendered as an operator renders it (secrets generated).
* :class:`PodPlanner` — one pod of a rendered workload as processes and files, as a kubelet would make it.
* :class:`Launcher` — the rendered objects applied to the real kube-apiserver, the pods run as processes.
* :data:`MAPPING` — the one table of what cannot exist here and what stands in for it.
* :func:`deployed_settings` — the emulated stack's in-process services, set as deploy/ sets their containers
  (:data:`EMULATED_AWAY`: what one process has no use for).
"""

from hami_sim.deployed._launcher import LaunchedPod, Launcher
from hami_sim.deployed._mapping import MAPPING, ServiceRoute, map_addresses, relocate
from hami_sim.deployed._pods import ContainerPlan, PodPlan, PodPlanner, PodSlot, TokenFile, service_routes
from hami_sim.deployed._render import Rendering, find_kubectl, prepare_tree, render
from hami_sim.deployed._settings import EMULATED_AWAY, deployed_env, deployed_settings

__all__ = [
    "EMULATED_AWAY",
    "MAPPING",
    "ContainerPlan",
    "LaunchedPod",
    "Launcher",
    "PodPlan",
    "PodPlanner",
    "PodSlot",
    "Rendering",
    "ServiceRoute",
    "TokenFile",
    "deployed_env",
    "deployed_settings",
    "find_kubectl",
    "map_addresses",
    "prepare_tree",
    "relocate",
    "render",
    "service_routes",
]
