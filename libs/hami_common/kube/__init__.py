"""The only module that talks to the Kubernetes apiserver, on the official ``kubernetes`` client.

* :class:`KubeClient` — typed async reads, annotation merge patches, pods/binding, leases, events, quotas;
  built from :class:`KubeSettings` (kubeconfig or in-cluster).
* :class:`WatchCache` with :func:`pod_source` / :func:`node_source` / :func:`quota_source` — list+watch
  caches that resume, re-list on 410 Gone and reconnect with backoff.
* :func:`update_node_annotations`, :func:`retry_on_conflict` — resourceVersion-guarded writes retried on 409.
* :class:`LeaderElector` — Lease-based leader election; :class:`EventRecorder` — core/v1 Events.
* Ports (``PodPatcher``, ``NodePatcher``, ``PodBinder``, ...) for code that should not know the client.

Tests and ``make run`` point the same code at :mod:`hami_sim.kubeapi`, an emulator of this API subset.
"""

from hami_common.kube._cache import Change, ChangeType, WatchCache, WatchStats
from hami_common.kube._client import JSON_PATCH, MERGE_PATCH, KubeClient
from hami_common.kube._config import load_api_client
from hami_common.kube._errors import from_client_error, from_status
from hami_common.kube._events import FAILED_SCHEDULING, EventRecorder, EventType, reference_to
from hami_common.kube._guarded import update_node_annotations
from hami_common.kube._leader import Action, LeaderElector, LeaseFollower, decide, holds_lease
from hami_common.kube._patches import (
    AnnotationChanges,
    JsonPatchOp,
    MetadataPatch,
    PatchMeta,
    guarded_annotation_patch,
    json_patch_body,
    node_annotation_patch,
    pod_annotation_patch,
)
from hami_common.kube._ports import (
    EventPort,
    LeasePort,
    NodePatcher,
    PodBinder,
    PodGuardedPatcher,
    PodPatcher,
    PodReader,
    QuotaReader,
)
from hami_common.kube._retry import Backoff, Retried, retry_on_conflict
from hami_common.kube._settings import KubeSettings
from hami_common.kube._stream import (
    ListWatch,
    ListWatcher,
    WatchItem,
    decode_watch_line,
    node_source,
    pod_source,
    quota_source,
)
from hami_common.kube._types import (
    Container,
    ContainerState,
    ContainerStateRunning,
    ContainerStateTerminated,
    ContainerStatus,
    Event,
    EventSource,
    Lease,
    LeaseSpec,
    ListMeta,
    Node,
    NodeAddress,
    NodeCondition,
    NodeList,
    NodeSpec,
    NodeStatus,
    ObjectList,
    ObjectMeta,
    ObjectReference,
    OwnerReference,
    Pod,
    PodCondition,
    PodList,
    PodSpec,
    PodStatus,
    ResourceQuota,
    ResourceQuotaList,
    ResourceQuotaSpec,
    ResourceQuotaStatus,
    ResourceRequirements,
    Status,
    Taint,
    Toleration,
)

__all__ = [
    "FAILED_SCHEDULING",
    "JSON_PATCH",
    "MERGE_PATCH",
    "Action",
    "AnnotationChanges",
    "Backoff",
    "Change",
    "ChangeType",
    "Container",
    "ContainerState",
    "ContainerStateRunning",
    "ContainerStateTerminated",
    "ContainerStatus",
    "Event",
    "EventPort",
    "EventRecorder",
    "EventSource",
    "EventType",
    "JsonPatchOp",
    "KubeClient",
    "KubeSettings",
    "LeaderElector",
    "Lease",
    "LeaseFollower",
    "LeasePort",
    "LeaseSpec",
    "ListMeta",
    "ListWatch",
    "ListWatcher",
    "MetadataPatch",
    "Node",
    "NodeAddress",
    "NodeCondition",
    "NodeList",
    "NodePatcher",
    "NodeSpec",
    "NodeStatus",
    "ObjectList",
    "ObjectMeta",
    "ObjectReference",
    "OwnerReference",
    "PatchMeta",
    "Pod",
    "PodBinder",
    "PodCondition",
    "PodGuardedPatcher",
    "PodList",
    "PodPatcher",
    "PodReader",
    "PodSpec",
    "PodStatus",
    "QuotaReader",
    "ResourceQuota",
    "ResourceQuotaList",
    "ResourceQuotaSpec",
    "ResourceQuotaStatus",
    "ResourceRequirements",
    "Retried",
    "Status",
    "Taint",
    "Toleration",
    "WatchCache",
    "WatchItem",
    "WatchStats",
    "decide",
    "decode_watch_line",
    "from_client_error",
    "from_status",
    "guarded_annotation_patch",
    "holds_lease",
    "json_patch_body",
    "load_api_client",
    "node_annotation_patch",
    "node_source",
    "pod_annotation_patch",
    "pod_source",
    "quota_source",
    "reference_to",
    "retry_on_conflict",
    "update_node_annotations",
]
