"""Trace context in pod annotations and the OTEL_* set-up."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hami_common import spans, tracing


@pytest.fixture
def provider() -> TracerProvider:
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    return p


def test_annotation_carries_the_trace_to_the_next_service(provider: TracerProvider) -> None:
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("admission") as admitted:
        value = tracing.to_annotation()
    assert value is not None
    assert value.startswith("00-")
    ctx = tracing.context_from_annotation(value)
    with tracer.start_as_current_span("filter", context=ctx) as filtered:
        assert filtered.get_span_context().trace_id == admitted.get_span_context().trace_id


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("", id="empty"),
        pytest.param("garbage", id="not a traceparent"),
        pytest.param("00-" + "0" * 32 + "-" + "0" * 16 + "-01", id="all-zero ids"),
        pytest.param("ff-" + "a" * 32 + "-" + "b" * 16 + "-01", id="forbidden version"),
        pytest.param("00-" + "a" * 31 + "-" + "b" * 16 + "-01", id="short trace id"),
    ],
)
def test_tenant_written_garbage_in_the_annotation_starts_no_trace(value: str, provider: TracerProvider) -> None:
    ctx = tracing.context_from_annotation(value)
    assert not trace.get_current_span(ctx).get_span_context().is_valid


def test_headers_round_trip_the_current_span(provider: TracerProvider) -> None:
    with provider.get_tracer("test").start_as_current_span("bind") as span:
        headers: dict[str, str] = {}
        tracing.inject_headers(headers)
    extracted = trace.get_current_span(tracing.context_from_headers(headers)).get_span_context()
    assert extracted.trace_id == span.get_span_context().trace_id
    assert extracted.span_id == span.get_span_context().span_id


def test_sdk_disabled_installs_nothing() -> None:
    assert tracing.setup_tracing("svc", env={"OTEL_SDK_DISABLED": "true"}) is None


def test_service_name_comes_from_otel_service_name() -> None:
    provider = tracing.setup_tracing("fallback", env={"OTEL_SERVICE_NAME": "hami-extender"})
    assert provider is not None
    assert provider.resource.attributes["service.name"] == "hami-extender"
    provider.shutdown()


def test_an_otlp_endpoint_adds_an_exporter() -> None:
    provider = tracing.setup_tracing("svc", env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert provider is not None
    processors = provider._active_span_processor._span_processors
    assert any(type(p).__name__ == "BatchSpanProcessor" for p in processors)
    provider.shutdown()


@pytest.mark.parametrize(
    ("subject", "name", "attributes"),
    [
        pytest.param(
            "hami.placement.gpu-1",
            "hami.placement process",
            {"node": "gpu-1"},
            id="a node's placements are one operation, the node an attribute",
        ),
        pytest.param(
            "hami.usage.gpu~example~com",
            "hami.usage process",
            {"node": "gpu.example.com"},
            id="a dotted node name comes back whole from its subject token",
        ),
        pytest.param(
            "hami.admission.team-a",
            "hami.admission process",
            {"namespace": "team-a"},
            id="an admission is one operation, the namespace an attribute",
        ),
        pytest.param("hami.other", "hami.other process", {}, id="a fixed subject is its own name"),
    ],
)
def test_consumer_span_names_carry_no_node(subject: str, name: str, attributes: dict[str, str]) -> None:
    assert spans.consume(subject) == name
    assert spans.consume_attributes(subject) == {spans.DESTINATION: subject, **attributes}
