"""OpenTelemetry set-up and the only way trace context enters or leaves a process.

Configuration comes only from the standard ``OTEL_*`` variables: ``OTEL_SDK_DISABLED``,
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, and an OTLP/HTTP exporter when
``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (the exporter reads the
rest of its variables itself). Without an endpoint spans are still created, so trace ids carry across
services, but nothing is exported.

Context is W3C trace context: in NATS headers (``traceparent``/``tracestate``) and in the pod annotation
``hami.io/trace-context`` (a ``traceparent`` value). Pod annotations are tenant-writable, so a value that
is not a well-formed ``traceparent`` is ignored, never trusted or raised.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from hami_common import spans

__all__ = [
    "TRACEPARENT",
    "context_from_annotation",
    "context_from_headers",
    "inject_headers",
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

_PROPAGATOR: Final = TraceContextTextMapPropagator()


def setup_tracing(
    service_name: str,
    env: Mapping[str, str] | None = None,
    extra_processor: SpanProcessor | None = None,
) -> TracerProvider | None:
    """Install the process's tracer provider from ``OTEL_*``; returns it (None when the SDK is disabled).

    Called once by a service's ``main``. ``extra_processor`` lets a test or ``hami up`` add its own sink.
    """
    environ = os.environ if env is None else env
    if environ.get(OTEL_SDK_DISABLED, "").strip().lower() == "true":
        return None
    name = environ.get(OTEL_SERVICE_NAME) or service_name
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    if environ.get(OTEL_TRACES_ENDPOINT) or environ.get(OTEL_ENDPOINT):
        # Imported only when used: the exporter pulls in protobuf and requests.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if extra_processor is not None:
        provider.add_span_processor(extra_processor)
    trace.set_tracer_provider(provider)
    return provider


def tracer() -> trace.Tracer:
    return trace.get_tracer(spans.INSTRUMENTATION)


def inject_headers(headers: MutableMapping[str, str], ctx: Context | None = None) -> None:
    """Write the current (or given) span's context into outgoing NATS headers."""
    _PROPAGATOR.inject(headers, context=ctx)


def context_from_headers(headers: Mapping[str, str] | None) -> Context:
    return _PROPAGATOR.extract(dict(headers or {}))


@contextmanager
def span_from_headers(
    name: str, headers: Mapping[str, str] | None, kind: SpanKind = SpanKind.CONSUMER
) -> Iterator[Span]:
    """A span continuing the trace whose context came in a message's headers."""
    with tracer().start_as_current_span(name, context=context_from_headers(headers), kind=kind) as span:
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
