"""The webhook's DRA mode (docs/dra.md): an admitted GPU pod's HAMi resources become ResourceClaimTemplates.

Pure. HAMi's rules judge the pod first, exactly as in extender mode (guards, quantities, privileged
containers, quotas, environment); then, for an allowed CREATE, :func:`to_dra` swaps extender mode's edits
of HAMi's resources for the DRA ones. Per container asking for an NVIDIA GPU:

* its HAMi resources (:func:`hami_common.dra.managed_names`) leave ``limits`` and ``requests``;
* ``resources.claims`` names the pod's claim entry ``<container>-nvidia``;
* ``spec.resourceClaims`` gets that entry, pointing at the template ``hami-nvidia-<digest>`` whose spec is
  :func:`hami_common.dra.claim_spec` of the container;
* the pod is labelled ``hami.io/dra=true``, as HAMi-DRA labels it.

Templates, not claims: a claim created before its pod exists cannot be owned by it (the pod has no uid
yet), which is how HAMi-DRA leaked claims (its issue #21). Kubernetes' resourceclaim controller makes each
pod's claim from the template, owned by the pod, and deletes it with the pod. A template is named by the
digest of its spec, so every pod of a namespace asking the same shares one and no pod leaves one behind.
schedulerName is left alone: the default kube-scheduler allocates claims.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

import msgspec

from hami_common.annotations.dra import DRA_LABEL, DRA_LABEL_ON
from hami_common.dra import (
    ClaimReference,
    PodResourceClaim,
    ResourceClaimTemplate,
    ResourceClaimTemplateSpec,
    TemplateMeta,
    claim_entry_name,
    claim_spec,
    managed_names,
    preferences,
    template_name,
)
from hami_common.errors import InvalidInput
from hami_common.resources import ContainerResources, ResourceConfig
from hami_webhook.admission import CREATE, HTTP_BAD_REQUEST, AdmissionPolicy, Outcome, Verdict
from hami_webhook.patch import ContainerList, PatchOp, escape_pointer
from hami_webhook.review import AdmissionRequest

__all__ = ["CLAIM_TAKEN", "DraTranslation", "dra_policy", "to_dra", "translate_pod"]

ADD: Final = "add"
REMOVE: Final = "remove"
CLAIM_TAKEN: Final = "container {container}: the pod already has a claim entry named {name}"


class _Wire(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What the translation reads of a pod beyond the rules' view: claims and labels. Unknown fields ignored."""


class _Named(_Wire, frozen=True):
    name: str = ""


class _Resources(_Wire, frozen=True):
    limits: dict[str, str] | None = None
    requests: dict[str, str] | None = None
    claims: tuple[_Named, ...] | None = None


class _Container(_Wire, frozen=True):
    name: str = ""
    resources: _Resources | None = None


class _Spec(_Wire, frozen=True):
    containers: tuple[_Container, ...] = ()
    init_containers: tuple[_Container, ...] = ()
    resource_claims: tuple[_Named, ...] | None = None


class _Meta(_Wire, frozen=True):
    namespace: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class _Pod(_Wire, frozen=True):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec = msgspec.field(default_factory=_Spec)


_DECODER: Final = msgspec.json.Decoder(_Pod)


@dataclass(frozen=True, slots=True)
class DraTranslation:
    """The JSON Patch ops of the DRA mode and the templates the pod's entries name (empty: no NVIDIA GPU)."""

    patch: tuple[PatchOp, ...] = ()
    templates: tuple[ResourceClaimTemplate, ...] = ()


def dra_policy(policy: AdmissionPolicy) -> AdmissionPolicy:
    """The rules' policy in DRA mode: schedulerName left alone (the default kube-scheduler allocates claims,
    and a pod naming another scheduler is translated all the same, as HAMi-DRA translates it)."""
    return dataclasses.replace(policy, scheduler_name="")


def _container_ops(prefix: str, ctr: _Container, entry: str, names: tuple[str, ...]) -> list[PatchOp]:
    res = ctr.resources or _Resources()
    ops = [
        PatchOp(op=REMOVE, path=f"{prefix}/resources/{kind}/{escape_pointer(name)}")
        for kind, quantities in (("limits", res.limits), ("requests", res.requests))
        for name in names
        if quantities is not None and name in quantities
    ]
    ref = ClaimReference(name=entry)
    if res.claims is None:
        # a GPU container always has resources (its HAMi quantities are there)
        ops.append(PatchOp(op=ADD, path=f"{prefix}/resources/claims", value=(ref,)))
    else:
        ops.append(PatchOp(op=ADD, path=f"{prefix}/resources/claims/-", value=ref))
    return ops


def translate_pod(raw: bytes, namespace: str, config: ResourceConfig) -> DraTranslation:
    """The DRA mode's edits of a pod (see the module); ``InvalidInput`` says what cannot be translated."""
    try:
        pod = _DECODER.decode(raw)
    except (msgspec.DecodeError, RecursionError) as err:
        raise InvalidInput(f"cannot decode the pod: {err}") from err
    prefs = preferences(pod.metadata.annotations or {})
    names = managed_names(config)
    taken = {entry.name for entry in pod.spec.resource_claims or ()}
    ops: list[PatchOp] = []
    entries: list[PodResourceClaim] = []
    templates: dict[str, ResourceClaimTemplate] = {}
    for which, containers in ((ContainerList.INIT, pod.spec.init_containers), (ContainerList.APP, pod.spec.containers)):
        for index, ctr in enumerate(containers):
            res = ctr.resources or _Resources()
            spec = claim_spec(ContainerResources(ctr.name, res.limits or {}, res.requests or {}), prefs, config)
            if spec is None:
                continue
            entry = claim_entry_name(ctr.name)
            if entry in taken:
                raise InvalidInput(CLAIM_TAKEN.format(container=ctr.name, name=entry))
            taken.add(entry)
            template = template_name(spec)
            templates[template] = ResourceClaimTemplate(
                metadata=TemplateMeta(name=template, namespace=namespace, labels={DRA_LABEL: DRA_LABEL_ON}),
                spec=ResourceClaimTemplateSpec(spec=spec),
            )
            entries.append(PodResourceClaim(name=entry, resource_claim_template_name=template))
            ops.extend(_container_ops(f"/spec/{which}/{index}", ctr, entry, names))
    if not entries:
        return DraTranslation()
    if pod.spec.resource_claims is None:
        ops.append(PatchOp(op=ADD, path="/spec/resourceClaims", value=tuple(entries)))
    else:
        ops.extend(PatchOp(op=ADD, path="/spec/resourceClaims/-", value=entry) for entry in entries)
    if pod.metadata.labels is None:
        ops.append(PatchOp(op=ADD, path="/metadata/labels", value={DRA_LABEL: DRA_LABEL_ON}))
    else:
        ops.append(PatchOp(op=ADD, path=f"/metadata/labels/{escape_pointer(DRA_LABEL)}", value=DRA_LABEL_ON))
    return DraTranslation(tuple(ops), tuple(templates.values()))


_QUANTITY_MAPS: Final = ("limits", "requests")


def _without_managed(op: PatchOp, names: tuple[str, ...]) -> PatchOp | None:
    """An extender-mode op less what it sets of HAMi's resources (defaultGPUNum, exclusive cores): the claim
    carries those now. None when nothing is left of it."""
    if any(op.path.endswith(f"/{kind}/{escape_pointer(n)}") for kind in _QUANTITY_MAPS for n in names):
        return None
    if op.path.endswith(tuple(f"/resources/{kind}" for kind in _QUANTITY_MAPS)) and isinstance(op.value, dict):
        rest = {key: text for key, text in op.value.items() if key not in names}  # a whole map added
        return dataclasses.replace(op, value=rest) if rest else None
    return op


def to_dra(
    req: AdmissionRequest, verdict: Verdict, config: ResourceConfig
) -> tuple[Verdict, tuple[ResourceClaimTemplate, ...]]:
    """An allowed CREATE's verdict in DRA mode, and the templates its pod names; anything else as it was.

    A pod that cannot be translated is ``Errored(400)`` with why, its warnings kept.
    """
    pod = verdict.pod
    if req.operation != CREATE or not verdict.allowed or pod is None:
        return verdict, ()
    try:
        translated = translate_pod(req.object, req.namespace or pod.metadata.namespace, config)
    except InvalidInput as err:
        refused = Verdict(Outcome.ERRORED, HTTP_BAD_REQUEST, str(err), pod=pod, warnings=verdict.warnings)
        return refused, ()
    if not translated.templates:
        return verdict, ()
    names = managed_names(config)
    kept = tuple(kept for op in verdict.patch if (kept := _without_managed(op, names)) is not None)
    return dataclasses.replace(verdict, patch=kept + translated.patch), translated.templates
