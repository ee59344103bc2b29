"""Traces show pods, not background work: with the tracing ``setup_tracing`` installs (as ``hami up`` and every
service do), a bus message that carries no trace context (a node's periodic usage) makes no trace, a message
of a pod's trace stays in it, and in the local stack each service reports its own ``service.name``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from hami_common import spans as names
from hami_common import subjects, tracing
from hami_common.annotations import TRACE_CONTEXT
from hami_common.bus import Bus, Delivery
from hami_common.events import UsageSample
from hami_sim.stack import LocalCluster
from hami_sim.stack.audit import gpu_pod
from hami_sim.waiting import eventually
from tests.e2e.conftest import stack_config

NODE = "gpu-node-1"


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """What a collector would receive from ``setup_tracing``'s default (no OTEL_* set)."""
    exporter = InMemorySpanExporter()
    trace._TRACER_PROVIDER_SET_ONCE._done = False  # the autouse fixture restores the previous one
    provider = tracing.setup_tracing("hami-up", env={}, extra_processor=SimpleSpanProcessor(exporter))
    assert provider is not None
    yield exporter
    provider.shutdown()


def sample(n: int) -> UsageSample:
    return UsageSample(
        node=NODE, pod_uid=f"u{n}", namespace="ns", pod="p", container="main", device_uuid="GPU-a",
        used_bytes=n, limit_bytes=100, at_ns=n,
    )  # fmt: skip


async def deliver(bus: Bus, count: int, *, in_trace_too: bool) -> None:
    """``count`` usage samples published with no trace context, and one more inside an admission span when
    ``in_trace_too``; returns once the subscriber has handled them all."""
    handled: list[UsageSample] = []

    async def on_usage(event: UsageSample, delivery: Delivery) -> None:
        handled.append(event)

    await bus.subscribe(subjects.usage(NODE), UsageSample, on_usage)
    for n in range(count):
        await bus.publish(subjects.usage(NODE), sample(n))
    if in_trace_too:
        with tracing.tracer().start_as_current_span(names.ADMIT, kind=SpanKind.SERVER):
            await bus.publish(subjects.usage(NODE), sample(count))
    total = count + (1 if in_trace_too else 0)
    await eventually(lambda: len(handled) == total or None, timeout=10, what="every sample handled")


def consumer_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CONSUMER]


async def test_background_messages_make_no_trace_and_a_pods_message_stays_in_its_trace(
    exported: InMemorySpanExporter, bus: Bus
) -> None:
    await deliver(bus, 5, in_trace_too=True)
    (admission,) = [s for s in exported.get_finished_spans() if s.name == names.ADMIT]
    (consumed,) = consumer_spans(exported)  # before: five more one-span traces, one per usage sample
    assert consumed.parent is not None
    assert consumed.parent.span_id == admission.context.span_id
    assert consumed.context.trace_id == admission.context.trace_id


async def test_otel_traces_sampler_brings_background_work_back(monkeypatch: pytest.MonkeyPatch, bus: Bus) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")  # the SDK reads it from the environment
    exporter = InMemorySpanExporter()
    trace._TRACER_PROVIDER_SET_ONCE._done = False
    provider = tracing.setup_tracing(
        "hami-up", env={"OTEL_TRACES_SAMPLER": "always_on"}, extra_processor=SimpleSpanProcessor(exporter)
    )
    assert provider is not None
    try:
        await deliver(bus, 3, in_trace_too=False)
        assert len(consumer_spans(exporter)) == 3
    finally:
        provider.shutdown()


async def test_local_stack_services_report_their_own_service_name(
    exported: InMemorySpanExporter, tmp_path: Path, sockdir: Path
) -> None:
    async with LocalCluster(stack_config(tmp_path, sockdir, nodes=1, gpus=2, node_hosts=0)) as cluster:
        created = await cluster.submit(gpu_pod("named", mem=2000, cores=20))
        async with asyncio.timeout(30):
            await cluster.wait_admitted([created["metadata"]["uid"]])
        pod = await cluster.kube.get_pod("default", "named")
        trace_id = int(pod.metadata.annotations[TRACE_CONTEXT].split("-")[1], 16)

        def spans_of_pod() -> list[ReadableSpan] | None:
            found = [s for s in exported.get_finished_spans() if s.context.trace_id == trace_id]
            return found if names.ALLOCATE in {s.name for s in found} else None

        mine = await eventually(spans_of_pod, timeout=10, what="the Allocate span")
        everything = exported.get_finished_spans()

    def services_of(name: str) -> set[tuple[object, object]]:
        return {
            (s.resource.attributes.get(SERVICE_NAME), s.resource.attributes.get(SERVICE_INSTANCE_ID))
            for s in mine
            if s.name == name
        }

    def service_of(name: str) -> tuple[object, object]:
        (service,) = services_of(name)
        return service

    node = pod.spec.node_name
    assert service_of(names.ADMIT)[0] == "hami-webhook"
    assert service_of(names.FILTER)[0] == "hami-extender"
    assert service_of(names.BIND)[0] == "hami-extender"
    # the node agent and the metrics service both consume the placement, each under its own name
    placement = services_of(names.consume(subjects.placement(node)))
    assert ("hami-nodeagent", node) in placement
    assert {name for name, _ in placement} == {"hami-nodeagent", "hami-metrics"}
    assert service_of(names.STAGE) == ("hami-nodeagent", node)
    assert service_of(names.ALLOCATE) == ("hami-allocator", node)
    # the node's inventory and usage went out the whole time: none of it became a trace of its own
    roots = [s for s in everything if s.parent is None]
    assert all(s.kind != SpanKind.CONSUMER for s in roots), [s.name for s in roots]
