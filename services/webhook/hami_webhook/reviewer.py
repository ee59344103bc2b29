"""One admission, end to end: decode the envelope, trace, judge, announce, encode the answer.

This is the webhook's protocol edge: an envelope that cannot be read is HTTP 400 (with an AdmissionReview
body that says why); everything else is HTTP 200 with an AdmissionReview carrying the request's uid in
the apiVersion it came in. The request path does no I/O (caches are in memory, events are only queued),
but for the DRA mode's ResourceClaimTemplates, written before the answer (:meth:`Reviewer.review_and_write`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, Tracer

from hami_common import logkeys, spans, subjects
from hami_common.dra import ResourceClaimTemplate
from hami_common.errors import HamiError, InvalidInput
from hami_common.events import AdmissionEvent
from hami_common.tracing import TRACEPARENT, context_from_headers, to_annotation, tracer
from hami_webhook.admission import (
    AdmissionPolicy,
    NamespaceRoster,
    NamespaceSource,
    NamespaceState,
    Outcome,
    Verdict,
    admit,
)
from hami_webhook.claimtemplates import TemplateWriter
from hami_webhook.dra import to_dra
from hami_webhook.patch import encode_patch
from hami_webhook.publisher import EventPublisher
from hami_webhook.review import (
    ADMISSION_V1,
    JSON_PATCH,
    AdmissionRequest,
    AdmissionResponse,
    NestedTooDeep,
    ResponseReview,
    ResultStatus,
    decode_review,
    encode_review,
    recover_uid,
)
from hami_webhook.settings import MAX_BODY_BYTES

__all__ = ["HTTP_BAD_REQUEST", "HTTP_INTERNAL", "INTERNAL_ERROR", "Answer", "NoCluster", "Reviewer", "error_review"]

log = logging.getLogger(__name__)

HTTP_OK: Final = 200
HTTP_BAD_REQUEST: Final = 400
HTTP_INTERNAL: Final = 500
FORBIDDEN: Final = "Forbidden"
INTERNAL_ERROR: Final = "internal error of the webhook"
TEMPLATES_FAILED: Final = "cannot write the pod's ResourceClaimTemplates: {error}"
# Span attributes of the admission span.
ATTR_OUTCOME: Final = "admission.outcome"
ATTR_GPU_CONTAINERS: Final = "admission.gpu_containers"
ATTR_NAMESPACE: Final = "k8s.namespace.name"

Answer = tuple[int, bytes]  # HTTP status, JSON body


@dataclass(frozen=True, slots=True)
class _Pending:
    """The DRA mode's templates an allowed pod names, with what a refusal would need to answer."""

    uid: str
    api_version: str
    templates: tuple[ResourceClaimTemplate, ...]


class NoCluster:
    """No caches: no quota is known, no namespace may disable control, and every namespace may exist."""

    def namespace(self, name: str) -> NamespaceState:
        return NamespaceState()

    def exists(self, name: str) -> bool:
        return True


def error_review(code: int, message: str, uid: str = "", api_version: str = ADMISSION_V1) -> bytes:
    response = AdmissionResponse(uid=uid, allowed=False, status=ResultStatus(code=code, message=message))
    return encode_review(ResponseReview(api_version=api_version, response=response))


def _response(req: AdmissionRequest, verdict: Verdict) -> AdmissionResponse:
    reason = FORBIDDEN if verdict.outcome is Outcome.DENIED else ""
    status = ResultStatus(code=verdict.code, message=verdict.message, reason=reason)
    if not verdict.patch:
        return AdmissionResponse(uid=req.uid, allowed=verdict.allowed, status=status, warnings=verdict.warnings)
    return AdmissionResponse(
        uid=req.uid,
        allowed=True,
        status=status,
        patch=encode_patch(verdict.patch),
        patch_type=JSON_PATCH,
        warnings=verdict.warnings,
    )


@dataclass(eq=False)
class Reviewer:
    policy: AdmissionPolicy
    namespaces: NamespaceSource = field(default_factory=NoCluster)
    roster: NamespaceRoster = field(default_factory=NoCluster)  # only namespaces that exist are announced
    events: EventPublisher | None = None
    stats: Counter[str] = field(default_factory=Counter)
    max_body_bytes: int = MAX_BODY_BYTES
    tracer: Tracer = field(default_factory=tracer)  # looked up once: a lookup builds a new Tracer
    # DRA mode (hami_webhook.dra, docs/dra.md) when set: the policy is then dra_policy's, and allowed pods
    # name ResourceClaimTemplates, which review_and_write creates before answering.
    templates: TemplateWriter | None = None

    def review(self, body: bytes, headers: Mapping[str, str] | None = None) -> Answer:
        """Judge one review; in DRA mode this writes no template (:meth:`review_and_write` does)."""
        return self._review(body, headers)[0]

    async def review_and_write(self, body: bytes, headers: Mapping[str, str] | None = None) -> Answer:
        """:meth:`review`, then the templates an allowed pod names, before the answer lets it be stored."""
        answer, pending = self._review(body, headers)
        if pending is None or self.templates is None:
            return answer
        try:
            await self.templates.ensure(pending.templates)
        except HamiError as err:
            self.stats["templates_failed"] += 1
            log.warning("DRA templates not written: %s", err)
            message = TEMPLATES_FAILED.format(error=err)
            return HTTP_OK, error_review(HTTP_INTERNAL, message, pending.uid, pending.api_version)
        return answer

    def _review(self, body: bytes, headers: Mapping[str, str] | None) -> tuple[Answer, _Pending | None]:
        try:
            envelope, req = decode_review(body)
        except InvalidInput as err:
            self.stats["malformed"] += 1
            log.warning("bad AdmissionReview (%d bytes): %s", len(body), err)
            recovered = recover_uid(body) if isinstance(err, NestedTooDeep) else None
            if recovered is not None:
                # The apiserver matches answers by uid: with it, the refusal reads as this webhook's 400,
                # not as a broken webhook ("expected response.uid").
                api_version, uid = recovered
                return (HTTP_OK, error_review(HTTP_BAD_REQUEST, str(err), uid, api_version)), None
            return (HTTP_BAD_REQUEST, error_review(HTTP_BAD_REQUEST, str(err))), None
        parent = None
        if headers is not None and TRACEPARENT in headers:
            parent = context_from_headers({TRACEPARENT: headers[TRACEPARENT]})
        with self.tracer.start_as_current_span(spans.ADMIT, context=parent, kind=SpanKind.SERVER) as span:
            verdict = admit(req, self.policy, self.namespaces, to_annotation())
            templates: tuple[ResourceClaimTemplate, ...] = ()
            if self.templates is not None:
                verdict, templates = to_dra(req, verdict, self.policy.resources)
            span.set_attribute(ATTR_OUTCOME, verdict.outcome.value)
            span.set_attribute(ATTR_GPU_CONTAINERS, verdict.gpu_containers)
            span.set_attribute(ATTR_NAMESPACE, req.namespace)
            self._record(req, verdict)
            body_out = encode_review(ResponseReview(api_version=envelope.api_version, response=_response(req, verdict)))
        pending = _Pending(req.uid, envelope.api_version, templates) if templates and not req.dry_run else None
        return (HTTP_OK, body_out), pending

    def _record(self, req: AdmissionRequest, verdict: Verdict) -> None:
        self.stats[verdict.outcome.value] += 1
        pod = verdict.pod
        namespace = req.namespace or (pod.metadata.namespace if pod else "")
        name = req.name or (pod.metadata.name or pod.metadata.generate_name if pod else "")
        uid = pod.metadata.uid if pod else ""
        if not verdict.allowed:
            log.info(
                "%s %s %s/%s: %s",
                verdict.outcome.value,
                req.operation,
                namespace,
                name,
                verdict.message,
                extra={logkeys.POD_UID: uid, logkeys.NAMESPACE: namespace, logkeys.POD: name},
            )
        if self.events is None or pod is None or req.dry_run:
            return  # a dry run has no side effects, announcements included
        if not self.roster.exists(namespace):
            # Only a forged review names a namespace that does not exist (the apiserver's NamespaceLifecycle
            # refuses pods there before any webhook): announced, it would be a metric series (issue 28 item 9).
            self.stats["unannounced"] += 1
            return
        try:
            subject = subjects.admission(namespace)
        except InvalidInput:
            return  # not a namespace name: nothing to announce it on
        event = AdmissionEvent(
            pod_uid=uid,
            namespace=namespace,
            name=name,
            allowed=verdict.allowed,
            mutated=bool(verdict.patch),
            gpu_containers=verdict.gpu_containers,
            reason=verdict.message,
            at_ns=time.time_ns(),
        )
        self.events.offer(subject, event, otel_context.get_current())
