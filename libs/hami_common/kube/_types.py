"""The subset of Kubernetes objects this project reads, as msgspec Structs.

Decoding ignores every field not declared here (an apiserver newer than this code adds fields all the
time), and ``camelCase`` wire names map to ``snake_case`` attributes. Quantities stay strings: parsing them
is the business of :mod:`hami_common.quantity`.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

from hami_common.resources import ContainerResources

__all__ = [
    "Container",
    "ContainerState",
    "ContainerStateTerminated",
    "ContainerStatus",
    "Event",
    "EventSource",
    "Lease",
    "LeaseSpec",
    "ListMeta",
    "Node",
    "NodeAddress",
    "NodeCondition",
    "NodeList",
    "NodeSpec",
    "NodeStatus",
    "ObjectList",
    "ObjectMeta",
    "ObjectReference",
    "OwnerReference",
    "Pod",
    "PodCondition",
    "PodList",
    "PodSpec",
    "PodStatus",
    "ResourceQuota",
    "ResourceQuotaList",
    "ResourceQuotaSpec",
    "ResourceQuotaStatus",
    "ResourceRequirements",
    "Status",
    "Taint",
    "Toleration",
    "WatchEvent",
]


T = TypeVar("T")


class _Wire(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """Base of every Kubernetes wire struct: immutable, camelCase on the wire."""


class OwnerReference(_Wire, frozen=True):
    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool = False


class ObjectMeta(_Wire, frozen=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    annotations: dict[str, str] = msgspec.field(default_factory=dict)
    owner_references: tuple[OwnerReference, ...] = ()


class ListMeta(_Wire, frozen=True):
    resource_version: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class ResourceRequirements(_Wire, frozen=True):
    limits: dict[str, str] = msgspec.field(default_factory=dict)
    requests: dict[str, str] = msgspec.field(default_factory=dict)


class Container(_Wire, frozen=True):
    name: str = ""
    image: str = ""
    resources: ResourceRequirements = msgspec.field(default_factory=ResourceRequirements)

    def as_resources(self) -> ContainerResources:
        """What request parsing reads of the container (``hami_common.resources``)."""
        return ContainerResources(name=self.name, limits=self.resources.limits, requests=self.resources.requests)


class ContainerStateTerminated(_Wire, frozen=True):
    exit_code: int = 0
    reason: str = ""


class ContainerStateRunning(_Wire, frozen=True):
    started_at: str | None = None


class ContainerState(_Wire, frozen=True):
    running: ContainerStateRunning | None = None
    terminated: ContainerStateTerminated | None = None


class ContainerStatus(_Wire, frozen=True):
    name: str = ""
    image: str = ""
    image_id: str = msgspec.field(default="", name="imageID")
    started: bool = False
    ready: bool = False
    restart_count: int = 0
    state: ContainerState = msgspec.field(default_factory=ContainerState)


class PodCondition(_Wire, frozen=True):
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""


class Toleration(_Wire, frozen=True):
    key: str = ""  # empty with operator Exists: every taint
    operator: str = ""  # "Equal" (the default) or "Exists"
    value: str = ""
    effect: str = ""  # empty: every effect
    toleration_seconds: int | None = None  # NoExecute: how long the pod stays once tainted


class PodSpec(_Wire, frozen=True):
    node_name: str = ""
    scheduler_name: str = ""
    priority: int = 0  # the PriorityClass value the apiserver resolved (preemption compares these)
    containers: tuple[Container, ...] = ()
    init_containers: tuple[Container, ...] = ()
    tolerations: tuple[Toleration, ...] = ()


class PodStatus(_Wire, frozen=True):
    phase: str = ""
    nominated_node_name: str = ""  # set by kube-scheduler on a preemptor: the node its victims free
    reason: str = ""  # e.g. UnexpectedAdmissionError when the kubelet could not admit the pod
    message: str = ""
    conditions: tuple[PodCondition, ...] = ()
    container_statuses: tuple[ContainerStatus, ...] = ()
    init_container_statuses: tuple[ContainerStatus, ...] = ()


class Pod(_Wire, frozen=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


class ObjectList(_Wire, Generic[T], frozen=True):
    """Any ``...List`` answer: ``ObjectList[Pod]`` decodes a PodList."""

    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: tuple[T, ...] = ()


PodList = ObjectList[Pod]


class NodeCondition(_Wire, frozen=True):
    type: str = ""
    status: str = ""


class NodeAddress(_Wire, frozen=True):
    type: str = ""
    address: str = ""


class Taint(_Wire, frozen=True):
    key: str = ""
    value: str = ""
    effect: str = ""  # NoSchedule, PreferNoSchedule or NoExecute


class NodeSpec(_Wire, frozen=True):
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()


class NodeStatus(_Wire, frozen=True):
    capacity: dict[str, str] = msgspec.field(default_factory=dict)
    allocatable: dict[str, str] = msgspec.field(default_factory=dict)
    conditions: tuple[NodeCondition, ...] = ()
    addresses: tuple[NodeAddress, ...] = ()


class Node(_Wire, frozen=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: NodeSpec = msgspec.field(default_factory=NodeSpec)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)


NodeList = ObjectList[Node]


class ResourceQuotaSpec(_Wire, frozen=True):
    hard: dict[str, str] = msgspec.field(default_factory=dict)


class ResourceQuotaStatus(_Wire, frozen=True):
    hard: dict[str, str] = msgspec.field(default_factory=dict)
    used: dict[str, str] = msgspec.field(default_factory=dict)


class ResourceQuota(_Wire, frozen=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: ResourceQuotaSpec = msgspec.field(default_factory=ResourceQuotaSpec)
    status: ResourceQuotaStatus = msgspec.field(default_factory=ResourceQuotaStatus)


ResourceQuotaList = ObjectList[ResourceQuota]


class LeaseSpec(_Wire, frozen=True):
    holder_identity: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: str | None = None
    renew_time: str | None = None
    lease_transitions: int | None = None


class Lease(_Wire, frozen=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: LeaseSpec = msgspec.field(default_factory=LeaseSpec)


class ObjectReference(_Wire, frozen=True):
    api_version: str = ""
    kind: str = ""
    namespace: str = ""
    name: str = ""
    uid: str = ""
    resource_version: str = ""


class EventSource(_Wire, frozen=True):
    component: str = ""
    host: str = ""


class Event(_Wire, frozen=True, omit_defaults=False):
    """A core/v1 Event, as ``kubectl describe`` shows it."""

    api_version: str = "v1"
    kind: str = "Event"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    involved_object: ObjectReference = msgspec.field(default_factory=ObjectReference)
    reason: str = ""
    message: str = ""
    type: str = "Normal"
    count: int = 1
    first_timestamp: str | None = None
    last_timestamp: str | None = None
    source: EventSource = msgspec.field(default_factory=EventSource)
    reporting_component: str = ""
    reporting_instance: str = ""


class Status(_Wire, frozen=True):
    """The apiserver's answer to a failed request (and to a successful bind)."""

    status: str = ""
    message: str = ""
    reason: str = ""
    code: int = 0


class WatchEvent(_Wire, frozen=True):
    """One line of a watch stream; ``object`` stays raw until its type (object, Status, bookmark) is known."""

    type: str
    object: msgspec.Raw
