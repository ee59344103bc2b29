"""The bus against a real nats-server: typed round trips, trace context, durability, poison messages."""

from __future__ import annotations

import asyncio
import logging
import uuid

import msgspec
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from hami_common import logkeys, subjects
from hami_common import spans as span_names
from hami_common.annotations import DeviceInfo
from hami_common.bus import Bus, ConsumerSpec, Delivery, EmbeddedNats, placement_consumer, placement_stream
from hami_common.errors import TransientError
from hami_common.events import (
    AdmissionEvent,
    AllocationResult,
    BusEvent,
    ContainerPlacement,
    NodeInventory,
    PlacedDevice,
    PlacementDecision,
    UsageSample,
)
from hami_common.settings import BusSettings

NODE = "gpu-node.example"
EVENTS: list[tuple[str, BusEvent]] = [
    (
        subjects.admission("team-a"),
        AdmissionEvent(pod_uid="u1", namespace="team-a", name="p", allowed=True, mutated=True, at_ns=1),
    ),
    (
        subjects.placement(NODE),
        PlacementDecision(
            pod_uid="u2", namespace="ns", name="p", node=NODE, bind_time_ns=2,
            containers=(
                ContainerPlacement(name="init", init=True),
                ContainerPlacement(
                    name="main",
                    devices=(PlacedDevice(uuid="GPU-a", type="NVIDIA", usedmem_mib=3000, usedcores=30),),
                ),
            ),
        ),
    ),
    (
        subjects.allocated(NODE),
        AllocationResult(pod_uid="u3", namespace="ns", name="p", node=NODE, container="main", ok=True, staged=True,
                         device_uuids=("GPU-a",), at_ns=3),
    ),
    (
        subjects.inventory(NODE),
        NodeInventory(node=NODE, devices=(DeviceInfo(id="GPU-a", count=10, devmem=81920, health=True),), at_ns=4),
    ),
    (
        subjects.usage(NODE),
        UsageSample(node=NODE, pod_uid="u5", namespace="ns", pod="p", container="main", device_uuid="GPU-a",
                    used_bytes=1 << 30, limit_bytes=3 << 30, sm_util_percent=25, at_ns=5),
    ),
]  # fmt: skip


@pytest.fixture
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace._TRACER_PROVIDER_SET_ONCE._done = False  # tests install their own provider each time
    trace.set_tracer_provider(provider)
    return exporter


@pytest.mark.parametrize(("subject", "event"), EVENTS, ids=[type(e).__name__ for _, e in EVENTS])
async def test_every_event_type_round_trips_with_its_trace_context(
    bus: Bus, spans: InMemorySpanExporter, subject: str, event: BusEvent
) -> None:
    received: asyncio.Queue[tuple[BusEvent, trace.SpanContext]] = asyncio.Queue()

    async def on_event(got: BusEvent, delivery: Delivery) -> None:
        await received.put((got, trace.get_current_span().get_span_context()))

    await bus.subscribe(subject, type(event), on_event)
    with trace.get_tracer("test").start_as_current_span("producer") as producer:
        await bus.publish(subject, event)
    got, consumer_ctx = await asyncio.wait_for(received.get(), 5)
    assert got == event
    assert consumer_ctx.trace_id == producer.get_span_context().trace_id
    (handler_span,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    assert handler_span.parent is not None
    assert handler_span.parent.span_id == producer.get_span_context().span_id


@pytest.mark.parametrize(("subject", "event"), EVENTS, ids=[type(e).__name__ for _, e in EVENTS])
async def test_a_consumer_span_is_named_after_the_subject_family_and_carries_the_node_as_an_attribute(
    bus: Bus, spans: InMemorySpanExporter, subject: str, event: BusEvent
) -> None:
    handled = asyncio.Event()

    async def on_event(got: BusEvent, delivery: Delivery) -> None:
        handled.set()

    await bus.subscribe(subject, type(event), on_event)
    with trace.get_tracer("test").start_as_current_span("producer"):
        await bus.publish(subject, event)
    await asyncio.wait_for(handled.wait(), 5)
    (consumer,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    family, _, _ = subject.rpartition(".")
    assert consumer.name == f"{family} process"
    assert consumer.attributes is not None
    assert consumer.attributes[span_names.DESTINATION] == subject
    if family == subjects.ADMISSION:
        assert consumer.attributes[logkeys.NAMESPACE] == "team-a"
    else:
        assert NODE not in consumer.name
        assert consumer.attributes[logkeys.NODE] == NODE


async def test_durable_placement_carries_trace_context_through_jetstream(bus: Bus, spans: InMemorySpanExporter) -> None:
    await bus.ensure_stream(placement_stream())
    subject, decision = EVENTS[1]
    received: asyncio.Queue[int] = asyncio.Queue()

    async def on_placement(got: PlacementDecision, delivery: Delivery) -> None:
        assert got == decision
        await received.put(trace.get_current_span().get_span_context().trace_id)

    with trace.get_tracer("test").start_as_current_span("bind") as producer:
        await bus.publish_durable(subject, decision)
    await bus.consume(placement_stream().name, placement_consumer(NODE), PlacementDecision, on_placement)
    assert await asyncio.wait_for(received.get(), 5) == producer.get_span_context().trace_id


async def test_declaring_streams_and_consumers_twice_is_harmless(bus: Bus) -> None:
    for _ in range(2):
        await bus.ensure_stream(placement_stream())
        await bus.ensure_consumer(placement_stream().name, placement_consumer(NODE))


def _decision(i: int) -> PlacementDecision:
    return PlacementDecision(pod_uid=f"pod-{i}", namespace="ns", name=f"p{i}", node=NODE, containers=(), bind_time_ns=i)


async def test_restarted_durable_consumer_receives_every_unacknowledged_message(
    nats_server: EmbeddedNats,
) -> None:
    settings = BusSettings(nats_url=nats_server.url)
    spec = placement_consumer(NODE, ack_wait_s=1.0)
    stream = placement_stream().name
    first_seen: asyncio.Queue[str] = asyncio.Queue()
    crash = asyncio.Event()

    async def crashing(got: PlacementDecision, delivery: Delivery) -> None:
        await first_seen.put(got.pod_uid)
        await crash.wait()  # the agent dies while handling: never acknowledges

    async with await Bus.connect(settings) as producer:
        await producer.ensure_stream(placement_stream())
        agent = await Bus.connect(settings)
        await agent.consume(stream, spec, PlacementDecision, crashing, batch=1)
        await producer.publish_durable(subjects.placement(NODE), _decision(0))
        assert await asyncio.wait_for(first_seen.get(), 5) == "pod-0"
        await agent.drain()  # stopped without acknowledging pod-0
        for i in (1, 2):  # published while no agent runs
            await producer.publish_durable(subjects.placement(NODE), _decision(i))

        seen: asyncio.Queue[tuple[str, int]] = asyncio.Queue()

        async def recording(got: PlacementDecision, delivery: Delivery) -> None:
            await seen.put((got.pod_uid, delivery.deliveries))

        async with await Bus.connect(settings) as restarted:
            await restarted.consume(stream, spec, PlacementDecision, recording)
            got = [await asyncio.wait_for(seen.get(), 10) for _ in range(3)]
    assert sorted(uid for uid, _ in got) == ["pod-0", "pod-1", "pod-2"]
    assert dict(got)["pod-0"] == 2  # redelivered, and says so


async def test_transient_failure_is_redelivered_until_handled(bus: Bus) -> None:
    await bus.ensure_stream(placement_stream())
    attempts: list[int] = []
    done = asyncio.Event()

    async def flaky(got: PlacementDecision, delivery: Delivery) -> None:
        attempts.append(delivery.deliveries)
        if len(attempts) < 3:
            raise TransientError("staging directory busy", retry_after=0.05)
        done.set()

    await bus.consume(placement_stream().name, placement_consumer(NODE), PlacementDecision, flaky)
    await bus.publish_durable(subjects.placement(NODE), _decision(7))
    await asyncio.wait_for(done.wait(), 10)
    assert attempts == [1, 2, 3]
    assert bus.stats.counts["retried"] == 2


@pytest.mark.parametrize("durable", [False, True], ids=["core", "jetstream"])
async def test_malformed_message_is_logged_once_counted_and_skipped(
    bus: Bus, nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture, durable: bool
) -> None:
    subject = subjects.placement(NODE)
    good: asyncio.Queue[str] = asyncio.Queue()

    async def on_placement(got: PlacementDecision, delivery: Delivery) -> None:
        await good.put(got.pod_uid)

    if durable:
        await bus.ensure_stream(placement_stream())
        await bus.consume(placement_stream().name, placement_consumer(NODE), PlacementDecision, on_placement)
    else:
        await bus.subscribe(subject, PlacementDecision, on_placement)
    async with await Bus.connect(BusSettings(nats_url=nats_server.url)) as raw:
        poison = [
            b"\xff\x00garbage",
            msgspec.msgpack.encode({"pod_uid": 5}),
            msgspec.msgpack.encode(EVENTS[0][1]),  # right bytes, wrong event type
        ]
        with caplog.at_level(logging.WARNING, logger="hami_common.bus._client"):
            for payload in poison:
                if durable:
                    await raw._js.publish(subject, payload)
                else:
                    await raw._nc.publish(subject, payload)
            await raw.publish(subject, _decision(9)) if not durable else await raw.publish_durable(
                subject, _decision(9)
            )
            assert await asyncio.wait_for(good.get(), 5) == "pod-9"
    assert bus.stats.malformed == len(poison)
    assert bus.stats.handled == 1
    malformed_lines = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(malformed_lines) == len(poison)


async def test_subscriber_survives_a_nats_restart(nats_server: EmbeddedNats) -> None:
    settings = BusSettings(nats_url=nats_server.url)
    received: asyncio.Queue[str] = asyncio.Queue()

    async def on_usage(got: UsageSample, delivery: Delivery) -> None:
        await received.put(got.pod_uid)

    async with await Bus.connect(settings) as consumer, await Bus.connect(settings) as producer:
        await consumer.subscribe(subjects.usage(NODE), UsageSample, on_usage)
        await asyncio.to_thread(nats_server.restart)
        sample = UsageSample(
            node=NODE, pod_uid=str(uuid.uuid4()), namespace="ns", pod="p", container="c", device_uuid="GPU-a",
            used_bytes=1, limit_bytes=2, at_ns=6,
        )  # fmt: skip
        heard = ""
        for _ in range(40):  # reconnection has no event we can await from here: publish until heard
            await producer.publish(subjects.usage(NODE), sample)
            try:
                heard = await asyncio.wait_for(received.get(), 0.5)
                break
            except TimeoutError:
                continue
        assert heard == sample.pod_uid


async def test_connect_gives_up_with_transient_error_when_no_server_listens() -> None:
    with pytest.raises(TransientError, match="cannot reach NATS"):
        await Bus.connect(BusSettings(nats_url="nats://127.0.0.1:1"), give_up_after=0.3)


def test_consumer_spec_names_are_per_node() -> None:
    spec: ConsumerSpec = placement_consumer("node-a")
    assert spec.filter_subject == subjects.placement("node-a")


async def test_a_publish_on_a_connection_nats_py_closed_is_a_transient_error(nats_server: EmbeddedNats) -> None:
    """nats-py closes a connection for good on the server's -ERR (an authorization refused while it reconnects,
    seen with 200 clients and the auth callout under load); a publish on it then raised nats-py's own error,
    which no caller expected, and crashed the allocator's follow-up worker."""
    bus = await Bus.connect(BusSettings(nats_url=nats_server.url, service_name="closing"))
    await bus.drain()
    assert bus.closed
    with pytest.raises(TransientError, match="connection closed"):
        await bus.publish(subjects.allocated("n1"), NodeInventory(node="n1", devices=(), at_ns=1))
