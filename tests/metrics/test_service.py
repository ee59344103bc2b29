"""The aggregator as a service: events published on a real NATS, /metrics scraped over real HTTP."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from hami_common import subjects
from hami_common.bus import Bus
from hami_common.events import (
    AdmissionEvent,
    AllocationResult,
    DeviceSample,
    FilterRefusal,
    NodePods,
    PodEnded,
    UsageSample,
)
from hami_metrics.aggregator import Shard
from hami_metrics.settings import MetricsSettings

from .conftest import (
    GPU_A,
    GPU_B,
    NODE,
    START_NS,
    FakeClock,
    Served,
    container,
    inventory,
    labels,
    placement,
    series,
    serve,
    usage,
)

MIB = 1 << 20
ZONE = {"zone": "vGPU"}


class WrongTypes(msgspec.Struct, tag="usage"):
    node: int


class UnknownTag(msgspec.Struct, tag="no-such-message"):
    node: str


class AsArray(msgspec.Struct, array_like=True):
    node: str


def dev_labels(gpu: str, index: str, **extra: str) -> frozenset[tuple[str, str]]:
    return labels(node=NODE, device_uuid=gpu, device_index=index, device_type="NVIDIA-A100", **extra, **ZONE)


async def test_inventory_and_placements_become_hami_device_and_pod_series(served: Served) -> None:
    await served.publish(subjects.inventory(NODE), inventory())
    await served.publish(
        subjects.placement(NODE),
        placement("u1", container("main", (GPU_A, 3000, 30))),
        placement("u2", container("a", (GPU_A, 1000, 10)), container("b", (GPU_A, 1000, 20), (GPU_B, 500, 5))),
    )
    samples = await served.scrape()

    assert series(samples, "hami_gpu_memory_limit_bytes")[dev_labels(GPU_A, "0")] == 81920 * MIB
    assert series(samples, "hami_gpu_core_limit_ratio")[dev_labels(GPU_B, "1")] == 100
    assert series(samples, "hami_gpu_memory_allocated_bytes") == {
        dev_labels(GPU_A, "0", device_cores="100"): 5000 * MIB,
        dev_labels(GPU_B, "1", device_cores="100"): 500 * MIB,
    }
    assert series(samples, "hami_gpu_shared_count") == {dev_labels(GPU_A, "0"): 3, dev_labels(GPU_B, "1"): 1}
    assert series(samples, "hami_gpu_core_allocated_ratio") == {dev_labels(GPU_A, "0"): 60, dev_labels(GPU_B, "1"): 5}
    overview = series(samples, "hami_node_gpu_overview")
    assert overview[dev_labels(GPU_A, "0", device_cores="100", device_memory_limit="81920")] == 5000 * MIB
    ratio = series(samples, "hami_node_gpu_memory_allocated_ratio")
    assert ratio[dev_labels(GPU_A, "0")] == 5000 / 81920

    pod_mem = series(samples, "hami_vgpu_memory_allocated_bytes")
    assert pod_mem == {
        labels(namespace="team-a", node=NODE, pod="pod-u1", container_index="0", device_uuid=GPU_A, **ZONE): 3000 * MIB,
        labels(namespace="team-a", node=NODE, pod="pod-u2", container_index="0", device_uuid=GPU_A, **ZONE): 2000 * MIB,
        labels(namespace="team-a", node=NODE, pod="pod-u2", container_index="0", device_uuid=GPU_B, **ZONE): 500 * MIB,
    }
    pod_core = series(samples, "hami_vgpu_core_allocated_ratio")
    assert (
        pod_core[labels(namespace="team-a", node=NODE, pod="pod-u2", container_index="0", device_uuid=GPU_A, **ZONE)]
        == 30
    )
    (build,) = series(samples, "hami_build_info")
    assert "zone" not in dict(build)


async def test_usage_and_device_samples_become_monitor_series(served: Served) -> None:
    now_s = START_NS // 1_000_000_000
    await served.publish(
        subjects.usage(NODE),
        usage("u1", GPU_A, used=600 * MIB, context_bytes=100 * MIB, module_bytes=0, buffer_bytes=500 * MIB,
              last_kernel_at_s=now_s - 7),
        DeviceSample(node=NODE, device_uuid=GPU_A, index=0, name="A100-SXM4-80GB", memory_used_bytes=9 * MIB,
                     utilization_percent=42, memory_utilization_percent=17, at_ns=START_NS),
    )  # fmt: skip
    samples = await served.scrape()
    ctr = labels(namespace="team-a", pod="pod-u1", container="main", vdevice_index="0", device_uuid=GPU_A[:40], **ZONE)
    assert series(samples, "hami_vgpu_memory_used_bytes") == {ctr: 600 * MIB}
    assert series(samples, "hami_vgpu_memory_limit_bytes") == {ctr: 4 << 30}
    assert series(samples, "hami_container_device_memory_bytes") == {ctr: 600 * MIB}
    assert series(samples, "hami_container_device_utilization_ratio") == {ctr: 30}
    assert series(samples, "hami_container_last_kernel_elapsed_seconds") == {ctr: 7}
    assert series(samples, "hami_vgpu_memory_context_bytes") == {ctr: 100 * MIB}
    assert series(samples, "hami_vgpu_memory_buffer_bytes") == {ctr: 500 * MIB}
    host = labels(node=NODE, device_index="0", device_uuid=GPU_A, device_type="NVIDIA-A100-SXM4-80GB", **ZONE)
    assert series(samples, "hami_host_gpu_memory_used_bytes") == {host: 9 * MIB}
    assert series(samples, "hami_host_gpu_utilization_ratio") == {host: 42}
    no_node = labels(device_index="0", device_uuid=GPU_A, device_type="NVIDIA-A100-SXM4-80GB", **ZONE)
    assert series(samples, "hami_host_gpu_memory_controller_utilization_ratio") == {no_node: 17}


async def test_a_plain_usage_sample_is_read_and_omits_what_it_does_not_carry(served: Served) -> None:
    plain = UsageSample(node=NODE, pod_uid="u1", namespace="ns", pod="p", container="c", device_uuid=GPU_A,
                        used_bytes=5, limit_bytes=10, at_ns=START_NS)  # fmt: skip
    await served.publish(subjects.usage(NODE), plain)
    samples = await served.scrape()
    assert len(series(samples, "hami_vgpu_memory_used_bytes")) == 1
    assert series(samples, "hami_vgpu_memory_context_bytes") == {}
    assert series(samples, "hami_container_last_kernel_elapsed_seconds") == {}


async def test_a_node_that_stops_reporting_disappears_after_the_staleness(served: Served, clock: FakeClock) -> None:
    await served.publish(subjects.inventory(NODE), inventory())
    await served.publish(subjects.inventory("gpu-2"), inventory("gpu-2"))
    await served.publish(subjects.usage(NODE), usage("u1"))
    clock.advance(60)
    await served.publish(subjects.inventory("gpu-2"), inventory("gpu-2"))  # only gpu-2 keeps reporting
    assert {dict(lb)["node"] for lb in series(await served.scrape(), "hami_gpu_memory_limit_bytes")} == {NODE, "gpu-2"}

    clock.advance(31)
    samples = await served.scrape()
    assert {dict(lb)["node"] for lb in series(samples, "hami_gpu_memory_limit_bytes")} == {"gpu-2"}
    assert series(samples, "hami_vgpu_memory_used_bytes") == {}
    assert series(samples, "hami_aggregator_nodes_expired_total")[frozenset()] == 1


async def test_a_pods_series_disappear_when_its_end_is_seen(served: Served) -> None:
    await served.publish(subjects.inventory(NODE), inventory())
    await served.publish(subjects.placement(NODE), placement("u1", container("main", (GPU_A, 3000, 30))))
    await served.publish(subjects.usage(NODE), usage("u1"), usage("u2"))
    await served.publish(subjects.usage(NODE), PodEnded(node=NODE, pod_uid="u1", at_ns=START_NS))
    samples = await served.scrape()
    assert series(samples, "hami_vgpu_memory_allocated_bytes") == {}
    assert {dict(lb)["pod"] for lb in series(samples, "hami_vgpu_memory_used_bytes")} == {"pod-u2"}
    assert series(samples, "hami_gpu_memory_allocated_bytes")[dev_labels(GPU_A, "0", device_cores="100")] == 0


async def test_malformed_messages_are_counted_and_skipped_and_the_service_goes_on(served: Served) -> None:
    junk = [WrongTypes(node=5), UnknownTag(node=NODE), AsArray(node=NODE)]
    for message in junk:
        await served.bus.publish(subjects.usage(NODE), message)
    await served.bus.publish(subjects.inventory(NODE), WrongTypes(node=5))
    wrong_subject = usage("u9", node="other-node")  # a node's usage published on another node's subject
    await served.bus.publish(subjects.usage(NODE), wrong_subject)
    await served.bus.publish(subjects.usage(NODE), usage("u9", node="Not A Node!"))  # not a Kubernetes name
    refusal = FilterRefusal(pod_uid="u9", namespace="team-b", name="p", nodes=1, at_ns=START_NS)
    await served.bus.publish(subjects.scheduling("team-a"), refusal)  # another namespace's subject
    await served.bus.publish(subjects.scheduling("team-a"), WrongTypes(node=5))
    await served.publish(subjects.inventory(NODE), inventory())  # ordered after the junk on one connection

    samples = await served.scrape()
    outcomes = {dict(lb)["outcome"]: v for lb, v in series(samples, "hami_bus_messages_total").items()}
    assert outcomes["malformed"] == len(junk) + 2
    assert outcomes["rejected"] == 3
    assert len(series(samples, "hami_gpu_memory_limit_bytes")) == 2
    assert series(samples, "hami_vgpu_memory_used_bytes") == {}


async def test_scheduling_path_metrics_follow_admission_bind_and_allocate(served: Served) -> None:
    await served.publish(
        subjects.admission("team-a"),
        AdmissionEvent(pod_uid="u1", namespace="team-a", name="p", allowed=True, mutated=True, gpu_containers=1,
                       at_ns=START_NS),
        AdmissionEvent(pod_uid="u2", namespace="team-a", name="q", allowed=False, at_ns=START_NS),
    )  # fmt: skip
    await served.publish(
        subjects.placement(NODE), placement("u1", container("main", (GPU_A, 1, 1)), bind_ns=START_NS + 50_000_000)
    )
    await served.publish(
        subjects.allocated(NODE),
        AllocationResult(pod_uid="u1", namespace="team-a", name="p", node=NODE, container="main", ok=True, staged=True,
                         at_ns=START_NS + 60_000_000),
    )  # fmt: skip
    samples = await served.scrape()
    admissions = series(samples, "hami_scheduling_admissions_total")
    assert admissions == {
        labels(namespace="team-a", result="mutated"): 1,
        labels(namespace="team-a", result="denied"): 1,
    }
    assert series(samples, "hami_scheduling_placements_total") == {frozenset(): 1}
    assert series(samples, "hami_scheduling_allocations_total") == {labels(path="staged", result="ok"): 1}
    assert series(samples, "hami_scheduling_admission_to_bind_seconds_count") == {frozenset(): 1}
    assert series(samples, "hami_scheduling_admission_to_bind_seconds_bucket")[labels(le="0.05")] == 1
    assert series(samples, "hami_scheduling_bind_to_allocate_seconds_bucket")[labels(path="staged", le="0.01")] == 1
    lag = series(samples, "hami_bus_delivery_lag_seconds_count")
    assert lag[labels(kind="admission")] == 2


async def test_legacy_names_appear_only_behind_the_switch(
    settings: MetricsSettings, bus: Bus, clock: FakeClock
) -> None:
    legacy = MetricsSettings(nats_url=settings.nats_url, legacy_metrics=True)
    async with serve(legacy, bus, clock) as running:
        await running.publish(subjects.inventory(NODE), inventory())
        await running.publish(subjects.usage(NODE), usage("u1", context_bytes=3, module_bytes=0, buffer_bytes=4))
        samples = await running.scrape()
    limit = series(samples, "GPUDeviceMemoryLimit")
    assert limit[labels(nodeid=NODE, deviceuuid=GPU_A, deviceidx="0", devicetype="NVIDIA-A100", **ZONE)] == 81920 * MIB
    used = series(samples, "vGPU_device_memory_usage_in_bytes")
    assert used == {labels(podnamespace="team-a", podname="pod-u1", ctrname="main", vdeviceid="0", deviceuuid=GPU_A,
                           **ZONE): 1 << 30}  # fmt: skip
    (desc,) = series(samples, "Device_memory_desc_of_container")
    assert dict(desc)["context"] == "3"
    assert dict(desc)["offset"] == str((1 << 30) - 7)
    assert series(samples, "hami_gpu_memory_limit_bytes")  # the new names stay


async def test_without_the_switch_no_legacy_name_appears(served: Served) -> None:
    await served.publish(subjects.inventory(NODE), inventory())
    assert not any(name == "GPUDeviceMemoryLimit" for name, _ in await served.scrape())


async def test_a_configured_token_guards_metrics_but_not_healthz(
    settings: MetricsSettings, bus: Bus, clock: FakeClock
) -> None:
    guarded = MetricsSettings(nats_url=settings.nats_url, metrics_token="s3cret")
    async with serve(guarded, bus, clock) as running:
        client = running.client
        missing = await client.get("/metrics")
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == "Bearer"
        assert (await client.get("/metrics", headers={"Authorization": "Bearer wrong"})).status_code == 401
        assert (await client.get("/metrics", headers={"Authorization": "Basic s3cret"})).status_code == 401
        assert (await client.get("/healthz")).status_code == 200
        assert await running.scrape(Authorization="Bearer s3cret")


async def test_gzip_is_served_to_scrapers_that_ask_for_it(served: Served) -> None:
    await served.publish(subjects.inventory(NODE), inventory())
    response = await served.client.get("/metrics", headers={"Accept-Encoding": "gzip"})
    assert response.headers["content-encoding"] == "gzip"
    assert "hami_gpu_memory_limit_bytes" in response.text  # httpx decompresses


async def test_healthz_reports_the_bus(served: Served) -> None:
    body = (await served.client.get("/healthz")).json()
    assert body["status"] == "ok"
    assert body["nats"] == "connected"


async def test_arbitrary_authorization_headers_get_401_and_the_server_keeps_serving(
    settings: MetricsSettings, bus: Bus, clock: FakeClock
) -> None:
    guarded = MetricsSettings(nats_url=settings.nats_url, metrics_token="s3cret")
    printable = st.characters(min_codepoint=32, max_codepoint=126)
    values = st.text(alphabet=printable, max_size=80).map(str.strip)  # HTTP forbids edge whitespace in values
    seen: list[str] = []

    @hsettings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(values)
    def collect(value: str) -> None:
        seen.append(value)

    collect()
    async with serve(guarded, bus, clock) as running:
        for value in seen:
            if value.strip() == "Bearer s3cret":
                continue
            response = await running.client.get("/metrics", headers={"Authorization": value})
            assert response.status_code == 401, value
        garbage = await running.client.get("/metrics?x=%ff%00", headers={"Accept-Encoding": "\x7f"})
        assert garbage.status_code in (400, 401)  # the HTTP parser may refuse the request line first
        assert (await running.client.get("/healthz")).status_code == 200


async def test_a_shard_keeps_only_its_own_nodes(settings: MetricsSettings, bus: Bus, clock: FakeClock) -> None:
    shard = Shard(index=1, count=2)
    mine = next(f"gpu-{i}" for i in range(100) if shard.owns(f"gpu-{i}"))
    theirs = next(f"gpu-{i}" for i in range(100) if not shard.owns(f"gpu-{i}"))
    sharded = MetricsSettings(nats_url=settings.nats_url, shard_index=1, shard_count=2)
    async with serve(sharded, bus, clock) as running:
        await running.bus.publish(subjects.inventory(theirs), inventory(theirs))
        admitted = AdmissionEvent(pod_uid="u", namespace="team-a", name="p", allowed=True, at_ns=START_NS)
        await running.bus.publish(subjects.admission("team-a"), admitted)
        await running.publish(subjects.inventory(mine), inventory(mine))  # ordered after the two skipped ones
        # Usage of the other shard's node is not even delivered: this shard subscribed to its own nodes only.
        await running.bus.publish(subjects.usage(theirs), usage("u1", node=theirs))
        await running.publish(subjects.usage(mine), usage("u2", node=mine))
        samples = await running.scrape()
    assert {dict(lb)["node"] for lb in series(samples, "hami_gpu_memory_limit_bytes")} == {mine}
    assert {dict(lb)["pod"] for lb in series(samples, "hami_vgpu_memory_used_bytes")} == {"pod-u2"}
    assert series(samples, "hami_scheduling_admissions_total") == {}
    assert series(samples, "hami_aggregator_shard_info") == {labels(index="1", count="2"): 1}
    received = series(samples, "hami_bus_messages_total")[labels(outcome="received")]
    assert received == 4  # two inventories, the admission, the usage of its own node


async def test_a_roster_on_the_bus_heals_a_lost_pod_end_and_a_missed_placement(served: Served) -> None:
    await served.publish(subjects.inventory(NODE), inventory())
    await served.publish(subjects.placement(NODE), placement("u1", container("main", (GPU_A, 1000, 10))))
    missed = placement("u2", container("main", (GPU_B, 2000, 20)))  # never seen on the placement subject
    await served.publish(subjects.usage(NODE), NodePods(node=NODE, pods=(missed,), at_ns=START_NS))
    pods = series(await served.scrape(), "hami_vgpu_memory_allocated_bytes")
    assert {dict(lb)["pod"]: v for lb, v in pods.items()} == {"pod-u2": 2000 * MIB}


async def test_reported_timings_fill_the_filter_bind_handoff_and_allocate_histograms(served: Served) -> None:
    placed = placement("u1", container("main", (GPU_A, 1, 1)))
    report = msgspec.structs.replace(placed, filter_ns=3_000_000, bind_ns=20_000_000, handoff_wait_ns=15_000_000)
    await served.publish(subjects.placement(NODE), report)
    await served.publish(
        subjects.allocated(NODE),
        AllocationResult(pod_uid="u1", namespace="team-a", name="p", node=NODE, container="main", ok=True,
                         staged=True, at_ns=START_NS, allocate_ns=400_000),
    )  # fmt: skip
    samples = await served.scrape()
    assert series(samples, "hami_scheduling_filter_seconds_sum") == {frozenset(): 0.003}
    assert series(samples, "hami_scheduling_bind_seconds_bucket")[labels(le="0.025")] == 1
    assert series(samples, "hami_scheduling_handoff_wait_seconds_count") == {frozenset(): 1}
    assert series(samples, "hami_scheduling_allocate_seconds_bucket")[labels(path="staged", le="0.001")] == 1
