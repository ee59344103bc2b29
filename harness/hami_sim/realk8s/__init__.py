"""The real Kubernetes control plane for tests, benchmarks and ``hami up --kube real``.

etcd, kube-apiserver, kube-scheduler, kubelet and kubectl are built by ``make k8s`` (``tools/k8s``) from their own Go
modules at pinned versions. :class:`ControlPlane` runs etcd and kube-apiserver with the API emulator's
surface; :class:`KubeScheduler` runs a ``hami-scheduler`` replica configured as ``deploy/`` configures it;
``_manifests`` renders ``deploy/kustomize/base`` with the real kubectl, so RBAC and the webhook
configuration are the deployed ones; :class:`RealKubelet` runs the real kubelet on a fake CRI runtime, so its
device manager calls our device plugin; :class:`KubeControllerManager` runs the controllers a test needs
(DRA's resourceclaim controller and the garbage collector).
"""

from hami_sim.realk8s._binaries import BIN_ENV, PEERS, BinariesMissing, K8sBinaries, find_binaries, repo_root
from hami_sim.realk8s._controllers import (
    CONTROLLER_MANAGER,
    DRA_CONTROLLERS,
    KubeControllerManager,
    find_controller_manager,
)
from hami_sim.realk8s._kubelet import DEVICE_PLUGIN_DIR, RealKubelet, mount_namespaces_work
from hami_sim.realk8s._manifests import (
    ManagedResource,
    apply,
    deployed,
    kubectl,
    managed_resources,
    policy_documents,
    rbac_documents,
    scheduler_configuration,
    webhook_configuration,
)
from hami_sim.realk8s._peer import Peer
from hami_sim.realk8s._plane import ADMIN_USER, SYSTEM_NAMESPACE, ApiError, ControlPlane, free_port
from hami_sim.realk8s._scheduler import KubeScheduler, uts_namespaces_work

__all__ = [
    "ADMIN_USER",
    "BIN_ENV",
    "CONTROLLER_MANAGER",
    "DEVICE_PLUGIN_DIR",
    "DRA_CONTROLLERS",
    "PEERS",
    "SYSTEM_NAMESPACE",
    "ApiError",
    "BinariesMissing",
    "ControlPlane",
    "K8sBinaries",
    "KubeControllerManager",
    "KubeScheduler",
    "ManagedResource",
    "Peer",
    "RealKubelet",
    "apply",
    "deployed",
    "find_binaries",
    "find_controller_manager",
    "free_port",
    "kubectl",
    "managed_resources",
    "mount_namespaces_work",
    "policy_documents",
    "rbac_documents",
    "repo_root",
    "scheduler_configuration",
    "uts_namespaces_work",
    "webhook_configuration",
]
