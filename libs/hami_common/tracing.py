"""OpenTelemetry set-up and the only way trace context enters or leaves a process.

Configuration comes only from the standard ``OTEL_*`` variables: ``OTEL_SDK_DISABLED``,
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, and an OTLP/HTTP exporter when
``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (the exporter reads the
rest of its variables itself). Without an endpoint spans are still created, so trace ids carry across
services, but nothing is exported.

Background work stays out of traces unless ``OTEL_TRACES_SAMPLER`` chooses otherwise: a bus message that
carries no trace context (a node's periodic usage or inventory, a metrics refresh) would start a one-span
trace of its own every few seconds per node and drown the one trace per pod in any collector, so such root
consumer spans are not sampled, and neither is what they cause; spans that continue a trace are kept.

Several services in one process (``hami up``) each report their own ``service.name``: a service's body runs
under :func:`service_scope`, and :func:`tracer` gives it a tracer whose resource names that service.

Context is W3C trace context: in NATS headers (``traceparent``/``tracestate``) and in the pod annotation
``hami.io/trace-context`` (a ``traceparent`` value). Pod annotations are tenant-writable, so a value that
is not a well-formed ``traceparent`` is ignored, never trusted or raised.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, SynchronousMultiSpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler, SamplingResult
from opentelemetry.trace import Link, Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from hami_common import spans

__all__ = [
    "TRACEPARENT",
    "QuietBackground",
    "context_from_annotation",
    "context_from_headers",
    "inject_headers",
    "service_scope",
    "setup_tracing",
    "span_from_headers",
    "to_annotation",
    "tracer",
]

TRACEPARENT: Final = "traceparent"
OTEL_SDK_DISABLED: Final = "OTEL_SDK_DISABLED"
OTEL_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_TRACES_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTEL_SERVICE_NAME: Final = "OTEL_SERVICE_NAME"
OTEL_TRACES_SAMPLER: Final = "OTEL_TRACES_SAMPLER"

_PROPAGATOR: Final = TraceContextTextMapPropagator()


class QuietBackground(Sampler):
    """The root sampler of :func:`setup_tracing`'s default: a root consumer span (a message that came with no
    trace context: periodic background work) is dropped, every other root span (an admission, a filter) is
    kept. Under ``ParentBased`` a child follows its parent, so a dropped message's handler publishes
    unsampled context and the work it causes stays out of traces too."""

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if kind == SpanKind.CONSUMER:
            return SamplingResult(Decision.DROP, None, trace_state)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, trace_state)

    def get_description(self) -> str:
        return "QuietBackground"


@dataclass(slots=True)
class _Installed:
    """What :func:`setup_tracing` installed: the services of the process share its sampler and processors."""

    root: TracerProvider
    sampler: Sampler | None
    processors: SynchronousMultiSpanProcessor
    by_service: dict[tuple[str, str], TracerProvider] = field(default_factory=dict)


_installed: _Installed | None = None
# (service.name, service.instance.id) of the service whose body runs in this context (hami up), or None
_TRACERS_KEPT: Final = 32
_TRACERS: dict[tuple[object, tuple[str, str] | None], trace.Tracer] = {}  # see tracer()
_SERVICE: Final[ContextVar[tuple[str, str] | None]] = ContextVar("hami_trace_service", default=None)


def setup_tracing(
    service_name: str,
    env: Mapping[str, str] | None = None,
    extra_processor: SpanProcessor | None = None,
) -> TracerProvider | None:
    """Install the process's tracer provider from ``OTEL_*``; returns it (None when the SDK is disabled).

    Called once by a service's ``main``. ``extra_processor`` lets a test or ``hami up`` add its own sink.
    Sampling: :class:`QuietBackground` under ``ParentBased``, or what ``OTEL_TRACES_SAMPLER`` names (the SDK
    reads it, and ``OTEL_TRACES_SAMPLER_ARG``, from the process environment).
    """
    global _installed
    environ = os.environ if env is None else env
    if environ.get(OTEL_SDK_DISABLED, "").strip().lower() == "true":
        return None
    name = environ.get(OTEL_SERVICE_NAME) or service_name
    sampler = None if environ.get(OTEL_TRACES_SAMPLER) else ParentBased(root=QuietBackground())
    processors = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
    provider = TracerProvider(
        sampler=sampler, resource=Resource.create({SERVICE_NAME: name}), active_span_processor=processors
    )
    if environ.get(OTEL_TRACES_ENDPOINT) or environ.get(OTEL_ENDPOINT):
        # Imported only when used: the exporter pulls in protobuf and requests.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if extra_processor is not None:
        provider.add_span_processor(extra_processor)
    trace.set_tracer_provider(provider)
    _installed = _Installed(provider, sampler, processors)
    return provider


@contextmanager
def service_scope(service_name: str, instance: str = "") -> Iterator[None]:
    """Spans started in this context (and the tasks it creates) report ``service_name`` (and ``instance``
    as ``service.instance.id``) rather than the process's name: ``hami up`` runs every service in one
    process, and a collector should still show the webhook, the extender and each node's agent apart."""
    token = _SERVICE.set((service_name, instance))
    try:
        yield
    finally:
        _SERVICE.reset(token)


def tracer() -> trace.Tracer:
    """The tracer of the service running in this context (see :func:`service_scope`), else the process's.

    Kept per provider and scope: the SDK's ``get_tracer`` compiles a warnings filter on every call, which
    was a tenth of a bind's CPU."""
    scope, installed, current = _SERVICE.get(), _installed, trace.get_tracer_provider()
    # Only while the provider setup_tracing installed is still the global one (a test may install its own).
    ours = scope is not None and installed is not None and current is installed.root
    key = (current, scope if ours else None)
    found = _TRACERS.get(key)
    if found is not None:
        return found
    if not ours or installed is None or scope is None:
        made = trace.get_tracer(spans.INSTRUMENTATION)
    else:
        provider = installed.by_service.get(scope)
        if provider is None:
            service_name, instance = scope
            attributes = {SERVICE_NAME: service_name} | ({SERVICE_INSTANCE_ID: instance} if instance else {})
            provider = TracerProvider(
                sampler=installed.sampler,
                resource=installed.root.resource.merge(Resource(attributes)),
                shutdown_on_exit=False,  # the processors are the root provider's: it shuts them down
                active_span_processor=installed.processors,
            )
            installed.by_service[scope] = provider
        made = provider.get_tracer(spans.INSTRUMENTATION)
    if len(_TRACERS) >= _TRACERS_KEPT:  # providers come and go in tests: never hold many
        _TRACERS.clear()
    _TRACERS[key] = made
    return made


def inject_headers(headers: MutableMapping[str, str], ctx: Context | None = None) -> None:
    """Write the current (or given) span's context into outgoing NATS headers."""
    _PROPAGATOR.inject(headers, context=ctx)


def context_from_headers(headers: Mapping[str, str] | None) -> Context:
    return _PROPAGATOR.extract(dict(headers or {}))


@contextmanager
def span_from_headers(
    name: str,
    headers: Mapping[str, str] | None,
    kind: SpanKind = SpanKind.CONSUMER,
    attributes: Attributes = None,
) -> Iterator[Span]:
    """A span continuing the trace whose context came in a message's headers."""
    with tracer().start_as_current_span(
        name, context=context_from_headers(headers), kind=kind, attributes=attributes
    ) as span:
        yield span


def to_annotation(ctx: Context | None = None) -> str | None:
    """The ``traceparent`` of the current (or given) span, for ``hami.io/trace-context``."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier.get(TRACEPARENT)


def context_from_annotation(value: str | None) -> Context:
    """Continue the pod's trace; an absent or malformed value gives the caller's current context."""
    if not value:
        return otel_context.get_current()
    return _PROPAGATOR.extract({TRACEPARENT: value.strip()})
