"""HAMi's admission rules, in HAMi's order (hami-protocol §3), plus this project's guards.

Pure: an :class:`~hami_webhook.review.AdmissionRequest`, the policy and a snapshot of what the caches know
about the namespace go in; a :class:`Verdict` (allowed with a JSON Patch, denied, or errored) comes out.
The order on CREATE:

1. decode the pod (``Errored(400)``); no containers → denied ``pod has no containers``;
2. (ours) scheduler-owned annotations set by a tenant → denied; GPU requests in ephemeral containers → denied;
3. the scheduler-name gate → allowed unchanged ``pod already has different scheduler assigned``;
4. per container, init containers first: percentage validation (``Errored(500)``), (ours) every other GPU
   quantity a non-negative integer (``Errored(400)``), ``CUDA_TASK_PRIORITY``,
   ``GPU_CORE_UTILIZATION_POLICY``, defaultGPUNum, exclusive-by-default cores, runtimeClassName,
   ``NVIDIA_VISIBLE_DEVICES=none``; (ours) ``CUDA_DISABLE_CONTROL`` removed from GPU containers; then every
   configured device family's step (:mod:`hami_webhook.vendors`; its refusal is ``Errored(500)``);
5. a privileged container in a GPU pod → denied ``container <name> is privileged``; (ours) one adding
   CAP_SYS_ADMIN → denied ``container <name> adds CAP_SYS_ADMIN``;
6. schedulerName set; a pod with a nodeName → denied ``pod has node assigned``;
7. the namespace quota, NVIDIA's and each family's → denied ``exceeding resource quota`` (ours: followed by
   the limit passed, the request, the namespace's use and the limit);
8. (ours) the trace context annotation; the patch.

(Ours, beyond HAMi) every CREATE verdict, whatever its outcome, carries the pod's likely typos as warnings
(:mod:`hami_webhook.typos`); they never change the outcome.

On UPDATE only the guards of step 2 apply, plus step 5 for ephemeral containers newly added to a GPU pod
(``pods/ephemeralcontainers``); other operations are allowed as they are.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from hami_common.annotations import TRACE_CONTEXT
from hami_common.errors import InvalidInput
from hami_common.resources import ContainerResources, ResourceConfig
from hami_common.scheduling.quota import NamespaceQuota, QuotaExcess, QuotaField
from hami_common.vendors import DEFAULT_CORE_POLICY, DeviceFamily, device_families
from hami_webhook.patch import ContainerList, PatchOp, PodEdits, render_patch
from hami_webhook.podview import SYS_ADMIN, ContainerSpec, PodView, decode_pod
from hami_webhook.reserved import touched_reserved_annotation
from hami_webhook.review import AdmissionRequest, is_empty
from hami_webhook.typos import known_names, typo_warnings
from hami_webhook.vendors import (
    admit_families,
    families_quota_excess,
    family_owned_annotations,
    family_resource_names,
)

__all__ = [
    "CREATE",
    "DEFAULT_SCHEDULER",
    "UPDATE",
    "AdmissionPolicy",
    "NamespaceRoster",
    "NamespaceSource",
    "NamespaceState",
    "Outcome",
    "Verdict",
    "admit",
]

CREATE: Final = "CREATE"
UPDATE: Final = "UPDATE"
DEFAULT_SCHEDULER: Final = "default-scheduler"

# HAMi's messages (HAMi: pkg/scheduler/webhook.go), then ours.
NO_CONTAINERS: Final = "pod has no containers"
OTHER_SCHEDULER: Final = "pod already has different scheduler assigned"
PRIVILEGED: Final = "container {name} is privileged"
NODE_ASSIGNED: Final = "pod has node assigned"
QUOTA_EXCEEDED: Final = "exceeding resource quota"
QUOTA_DETAIL: Final = (
    QUOTA_EXCEEDED + ": limits.{resource}: the pod requests {requested}{unit}, the namespace uses {used}{unit}, "
    "the limit is {limit}{unit}"
)
MIB: Final = " MiB"
NO_CONTENT: Final = "there is no content to decode"
RESERVED_ANNOTATION: Final = "annotation {key} is reserved for the GPU scheduler; {user} may not set or change it"
EPHEMERAL_GPU: Final = "ephemeral container {name} requests {resource}: ephemeral containers cannot have GPUs"
SYS_ADMIN_ADDED: Final = "container {name} adds CAP_SYS_ADMIN"
ALL_ADDED: Final = "container {name} adds CAP_SYS_ADMIN (capabilities.add {written!r} is every capability)"

HTTP_OK: Final = 200
HTTP_BAD_REQUEST: Final = 400
HTTP_FORBIDDEN: Final = 403
HTTP_INTERNAL: Final = 500


class Outcome(enum.StrEnum):
    ALLOWED = "allowed"
    DENIED = "denied"  # a rule said no: 403 Forbidden
    ERRORED = "errored"  # the request could not be judged: 400 or 500, as HAMi answers


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    code: int = HTTP_OK
    message: str = ""
    patch: tuple[PatchOp, ...] = ()
    pod: PodView | None = None
    gpu_containers: int = 0
    warnings: tuple[str, ...] = ()  # the pod's likely typos (hami_webhook.typos); never change the outcome

    @property
    def allowed(self) -> bool:
        return self.outcome is Outcome.ALLOWED


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """The webhook's knobs (hami-protocol §1.2, §1.4) and the system's own users.

    ``resources``, ``overwrite_env``, ``gpu_core_policy`` and ``runtime_class_name`` are the device config's
    top-level knobs, which build its default family; ``families`` are its sections' families. ``devices`` is
    every family, in HAMi's order, and the only thing the rules below loop over.
    """

    resources: ResourceConfig = field(default_factory=ResourceConfig)
    scheduler_name: str = "hami-scheduler"  # HAMi's --scheduler-name; "" leaves schedulerName alone
    force_overwrite_default_scheduler: bool = True
    overwrite_env: bool = False
    gpu_core_policy: str = DEFAULT_CORE_POLICY
    runtime_class_name: str = ""
    system_users: frozenset[str] = frozenset()
    families: tuple[DeviceFamily, ...] = ()  # the families the device config's sections enable
    devices: tuple[DeviceFamily, ...] = field(init=False)

    def __post_init__(self) -> None:
        devices = device_families(
            self.resources,
            self.families,
            gpu_core_policy=self.gpu_core_policy,
            overwrite_env=self.overwrite_env,
            runtime_class_name=self.runtime_class_name,
        )
        object.__setattr__(self, "devices", devices)  # derived once; the policy is frozen


@dataclass(frozen=True, slots=True)
class NamespaceState:
    """What the caches know about the pod's namespace when the request arrives."""

    may_disable_control: bool = False
    quotas: Mapping[str, NamespaceQuota] = field(default_factory=dict)  # the limited families', by common word


class NamespaceSource(Protocol):
    """What the caches know about a namespace (:class:`~hami_webhook.cluster.ClusterState` is one)."""

    def namespace(self, name: str) -> NamespaceState: ...


class NamespaceRoster(Protocol):
    """Which namespaces exist (:class:`~hami_webhook.cluster.ClusterState` is one)."""

    def exists(self, name: str) -> bool: ...


def _allowed(message: str = "", pod: PodView | None = None) -> Verdict:
    return Verdict(Outcome.ALLOWED, HTTP_OK, message, pod=pod)


def _denied(message: str, pod: PodView | None = None) -> Verdict:
    return Verdict(Outcome.DENIED, HTTP_FORBIDDEN, message, pod=pod)


def _errored(code: int, message: str, pod: PodView | None = None) -> Verdict:
    return Verdict(Outcome.ERRORED, code, message, pod=pod)


def admit(
    req: AdmissionRequest, policy: AdmissionPolicy, namespaces: NamespaceSource, trace_context: str | None = None
) -> Verdict:
    """Judge one admission request; never raises for anything a request can contain.

    ``namespaces`` is asked about the pod's namespace (the request's, else the pod's own) once a CREATE
    has passed the scheduler-name gate; ``trace_context`` becomes the GPU pod's trace annotation.
    """
    judged = req.operation in (CREATE, UPDATE)
    if is_empty(req.object):
        # A DELETE carries no object. HAMi would answer 400 here, but it is never sent one (registered for
        # CREATE only); answering 400 would block pod deletion wherever the webhook sees deletes.
        return _errored(HTTP_BAD_REQUEST, NO_CONTENT) if judged else _allowed()
    try:
        # Decoded whatever the operation, as HAMi decodes before it looks at anything: an object that is
        # not a Pod is Errored(400), never waved through because of an operation we do not judge.
        pod = decode_pod(req.object)
        old = decode_pod(req.old_object) if req.operation == UPDATE and not is_empty(req.old_object) else None
    except InvalidInput as err:
        return _errored(HTTP_BAD_REQUEST, str(err))
    if not judged:
        return _allowed()
    if req.operation == UPDATE:
        return _guards(req, pod, old, policy) or _allowed(pod=pod)
    try:
        verdict = _create(req, pod, policy, namespaces, trace_context)
    except InvalidInput as err:  # a quantity that does not parse: Go's decoder would have refused the pod
        verdict = _errored(HTTP_BAD_REQUEST, str(err), pod)
    warnings = _typos(pod, policy)
    return dataclasses.replace(verdict, warnings=warnings) if warnings else verdict


def _typos(pod: PodView, policy: AdmissionPolicy) -> tuple[str, ...]:
    spec = pod.spec
    containers = [ctr.as_resources() for ctr in (*spec.init_containers, *spec.containers, *spec.ephemeral_containers)]
    return typo_warnings(pod.annotations, containers, known_names(policy.devices))


def _guards(req: AdmissionRequest, pod: PodView, old: PodView | None, policy: AdmissionPolicy) -> Verdict | None:
    user = req.user_info.username
    if user not in policy.system_users:
        key = touched_reserved_annotation(
            pod.annotations, None if old is None else old.annotations, family_owned_annotations(policy.devices)
        )
        if key is not None:
            return _denied(RESERVED_ANNOTATION.format(key=key, user=user or "an anonymous user"), pod)
    names = family_resource_names(policy.devices)
    for ctr in pod.spec.ephemeral_containers:
        res = ctr.as_resources()
        for name in names:
            if res.asks_for(name):
                return _denied(EPHEMERAL_GPU.format(name=ctr.name, resource=name), pod)
    if req.operation == UPDATE and _is_gpu_pod(pod, names):
        # An ephemeral container added to a GPU pod (pods/ephemeralcontainers) shares its namespaces: a
        # privileged one could reach the GPUs and the interposer's files as a privileged GPU container would.
        # Only newly added ones count, so the system's later patches of an older pod keep working.
        existing = {ctr.name for ctr in old.spec.ephemeral_containers} if old is not None else set()
        for ctr in pod.spec.ephemeral_containers:
            if ctr.name not in existing and (escalation := _escalation(ctr)) is not None:
                return _denied(f"ephemeral {escalation}", pod)
    return None


def _escalation(ctr: ContainerSpec) -> str | None:
    """Why a container may not run in a GPU pod, or None: it escapes the isolation the interposer relies on."""
    if ctr.privileged:
        return PRIVILEGED.format(name=ctr.name)
    added = ctr.added_sys_admin
    if added is not None:
        plain = added.upper().removeprefix("CAP_") == SYS_ADMIN
        return SYS_ADMIN_ADDED.format(name=ctr.name) if plain else ALL_ADDED.format(name=ctr.name, written=added)
    return None


def _is_gpu_pod(pod: PodView, names: tuple[str, ...]) -> bool:
    containers = (*pod.spec.init_containers, *pod.spec.containers)
    return any(ctr.as_resources().asks_for(name) for ctr in containers for name in names)


def _other_scheduler(pod: PodView, policy: AdmissionPolicy) -> bool:
    name = pod.spec.scheduler_name or ""
    return (
        name != ""
        and (name != DEFAULT_SCHEDULER or not policy.force_overwrite_default_scheduler)
        and (policy.scheduler_name == "" or name != policy.scheduler_name)
    )


def _create(
    req: AdmissionRequest,
    pod: PodView,
    policy: AdmissionPolicy,
    namespaces: NamespaceSource,
    trace_context: str | None,
) -> Verdict:
    if not pod.spec.containers:
        return _denied(NO_CONTAINERS, pod)
    guarded = _guards(req, pod, None, policy)
    if guarded is not None:
        return guarded
    if _other_scheduler(pod, policy):
        return _allowed(OTHER_SCHEDULER, pod)
    edits = PodEdits()
    mutated: dict[ContainerList, list[ContainerResources]] = {ContainerList.INIT: [], ContainerList.APP: []}
    gpu_containers = 0
    runtime_class = pod.spec.runtime_class_name
    namespace = namespaces.namespace(req.namespace or pod.metadata.namespace)
    for which, containers in ((ContainerList.INIT, pod.spec.init_containers), (ContainerList.APP, pod.spec.containers)):
        for index, ctr in enumerate(containers):
            res = ctr.as_resources()
            bad = _bad_quantity(res, policy.devices)
            if bad is not None:
                return _errored(HTTP_BAD_REQUEST, bad, pod)
            edit = edits.container(which, index)
            try:
                family = admit_families(policy.devices, res, edit, pod.annotations)
            except InvalidInput as err:  # HAMi: any MutateAdmission error is Errored(500, err)
                return _errored(HTTP_INTERNAL, str(err), pod)
            res = family.resources
            if family.asks and runtime_class is None and family.runtime_class:
                runtime_class = edits.runtime_class_name = family.runtime_class
            if family.guarded_env and not namespace.may_disable_control and ctr.env:
                edit.env_removed.extend(i for i, env in enumerate(ctr.env) if env.name in family.guarded_env)
            mutated[which].append(res)
            if family.asks:
                gpu_containers += 1
    for ctr in (*pod.spec.init_containers, *pod.spec.containers):
        if gpu_containers and (escalation := _escalation(ctr)) is not None:
            return _denied(escalation, pod)
    if gpu_containers and policy.scheduler_name:
        edits.scheduler_name = policy.scheduler_name
        if pod.spec.node_name:
            return _denied(NODE_ASSIGNED, pod)
    init, app = mutated[ContainerList.INIT], mutated[ContainerList.APP]
    family_excess = families_quota_excess(policy.devices, namespace.quotas, init, app)
    if family_excess is not None:
        limited, excess = family_excess
        return _denied(_quota_denial(excess, limited.quota.memory_name, limited.quota.core_name), pod)
    if gpu_containers and trace_context and TRACE_CONTEXT not in pod.annotations:
        edits.annotations[TRACE_CONTEXT] = trace_context
    patch = () if edits.empty else render_patch(pod, edits)
    return Verdict(Outcome.ALLOWED, HTTP_OK, "", patch, pod, gpu_containers)


def _quota_denial(excess: QuotaExcess, memory_name: str, core_name: str) -> str:
    """HAMi's ``exceeding resource quota``, then which limit, the request, the namespace's use and the limit."""
    memory = excess.field is QuotaField.MEMORY
    return QUOTA_DETAIL.format(
        resource=memory_name if memory else core_name,
        requested=excess.requested,
        used=excess.used,
        limit=excess.limit,
        unit=MIB if memory else "",
    )


def _bad_quantity(res: ContainerResources, families: tuple[DeviceFamily, ...]) -> str | None:
    """Why a managed quantity of this container cannot be honoured, or None.

    HAMi parses every request field into an int32 and, where one does not fit (``gpumem: 3Gi`` is
    3221225472 MiB), reads the container as asking for no device: the pod would then be bound with no
    placement and served another pod's grant at Allocate. kube-apiserver lets such values through (they
    are whole and non-negative), so the rule is ours: every managed resource of every configured family, in
    limits and in requests, is a whole number its request can hold (:meth:`DeviceFamily.check`: from 0 to
    2³¹-1, in range once scaled by a memory unit, NVIDIA's core percentage at most 100). The message
    (``hami_common.resources.BAD_QUANTITY``) names the resource and the accepted range.
    """
    try:
        for family in families:
            family.check(res)
    except InvalidInput as err:
        return str(err)
    return None
