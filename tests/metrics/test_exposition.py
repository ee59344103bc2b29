"""The exposition: text format correctness (promtool, prometheus_client's parser and encoder), escaping."""

from __future__ import annotations

import subprocess

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from hami_common.annotations import MigAllocation, MigPlacement
from hami_common.events import (
    AdmissionEvent,
    AllocationResult,
    ContainerPlacement,
    DeviceSample,
    PlacedDevice,
    PlacementDecision,
    QuotaResource,
    QuotaUsage,
    UsageSample,
)
from hami_metrics.collector import FamilyCollector
from hami_metrics.exposition import AnyFamily, BuildInfo, Family, HistogramFamily, RowGroup, Scrape, collect
from hami_metrics.state import ClusterState, Event, apply
from hami_metrics.textformat import TextRenderer

from .conftest import GPU_A, GPU_B, NODE, START_NS, container, inventory, parse, placement, series, usage

MIG_INSTANCE = MigAllocation(
    container_index=0,
    device_index=0,
    gpu_uuid=GPU_B,
    profile="1g.10gb",
    placement=MigPlacement(start=6, size=1),
    mig_uuid="MIG-0b3c5d1e-7f80-5a2b-9c3d-4e5f60718293",
    gpu_instance_id=13,
    compute_instance_id=0,
)
BUILD = BuildInfo(version="0.1.0", revision="abc", build_date="2026-01-01")


def populated() -> ClusterState:
    """A state that makes every family carry samples."""
    events: list[object] = [
        inventory(),
        msgspec.structs.replace(
            placement("u1", container("init", (GPU_A, 500, 5), init=True), container("main", (GPU_A, 3000, 30))),
            filter_ns=2_000_000, bind_ns=9_000_000, handoff_wait_ns=4_000_000,
        ),
        placement("u3", msgspec.structs.replace(container("mig", (GPU_B, 9856, 14)), mig=(MIG_INSTANCE,))),
        usage("u1", GPU_A, context_bytes=1, module_bytes=2, buffer_bytes=3, last_kernel_at_s=START_NS // 10**9 - 2),
        usage("u2", GPU_B),
        DeviceSample(node=NODE, device_uuid=GPU_A, index=0, name="A100", memory_used_bytes=7, at_ns=START_NS),
        AdmissionEvent(pod_uid="u1", namespace="team-a", name="p", allowed=True, gpu_containers=1, at_ns=START_NS),
        AllocationResult(pod_uid="u1", namespace="team-a", name="p", node=NODE, container="main", ok=True,
                         staged=False, at_ns=START_NS + 10**8, allocate_ns=30_000_000),
        AllocationResult(pod_uid="u3", namespace="team-a", name="pod-u3", node=NODE, container="mig", ok=True,
                         staged=True, at_ns=START_NS, mig=(MIG_INSTANCE,)),
        QuotaUsage(namespace="team-a", resources=(QuotaResource(name="nvidia.com/gpumem", used=3000, limit=8000),),
                   at_ns=START_NS),
    ]  # fmt: skip
    state = ClusterState()
    for event in events:
        state = apply(state, event, START_NS)  # type: ignore[arg-type]
    return state


def scrape(legacy: bool = False) -> Scrape:
    return Scrape(now_ns=START_NS, build=BUILD, legacy=legacy, bus_counts={"received": 9, "malformed": 1})


def test_exposition_passes_promtool_check_metrics(promtool: str) -> None:
    body = TextRenderer().render(collect(populated(), scrape()))
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()


def plain(families: list[AnyFamily]) -> list[Family | HistogramFamily]:
    return [f for item in families for f in (item.families() if isinstance(item, RowGroup) else [item])]


def test_every_family_carries_samples_in_the_populated_state() -> None:
    families = plain(collect(populated(), scrape(legacy=True)))
    assert [f.spec.name for f in families if not f.series] == []
    names = [f.spec.name for f in families]
    assert len(names) == len(set(names))


def test_own_text_and_prometheus_client_encode_the_same_samples() -> None:
    families = collect(populated(), scrape(legacy=True))
    ours = parse(TextRenderer().render(families).decode())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FamilyCollector(lambda: families))
    theirs = parse(generate_latest(registry).decode())
    assert ours == theirs


def test_rendering_again_from_the_caches_gives_the_same_bytes() -> None:
    renderer, state = TextRenderer(), populated()
    first = renderer.render(collect(state, scrape(legacy=True)))
    assert renderer.render(collect(state, scrape(legacy=True))) == first


def test_a_replaced_record_is_rendered_anew() -> None:
    renderer, state = TextRenderer(), populated()
    renderer.render(collect(state, scrape()))
    state = apply(state, usage("u1", GPU_A, used=12345), START_NS)
    used = series(parse(renderer.render(collect(state, scrape())).decode()), "hami_vgpu_memory_used_bytes")
    assert sorted(used.values()) == [12345, 1 << 30]


label_text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=30)


@settings(max_examples=60, deadline=None)
@given(namespace=label_text, pod=label_text, model=label_text)
def test_any_label_value_round_trips_through_the_text_format(namespace: str, pod: str, model: str) -> None:
    event = usage("u1").__class__(
        node=NODE, pod_uid="u1", namespace=namespace, pod=pod, container="c", device_uuid=GPU_A,
        used_bytes=1, limit_bytes=2, at_ns=START_NS,
    )  # fmt: skip
    sample = DeviceSample(node=NODE, device_uuid=GPU_A, index=0, name=model, memory_used_bytes=3, at_ns=START_NS)
    state = apply(apply(ClusterState(), event, START_NS), sample, START_NS)
    samples = parse(TextRenderer().render(collect(state, scrape())).decode())
    used = {dict(lb)["pod"]: dict(lb)["namespace"] for (name, lb) in samples if name == "hami_vgpu_memory_used_bytes"}
    assert used == {pod: namespace}
    host = [dict(lb)["device_type"] for (name, lb) in samples if name == "hami_host_gpu_memory_used_bytes"]
    assert host == ["NVIDIA-" + model]


def test_with_legacy_names_promtool_objects_only_to_hamis_camel_case(promtool: str) -> None:
    body = TextRenderer().render(collect(populated(), scrape(legacy=True)))
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60, check=False)
    problems = [line for line in (result.stdout + result.stderr).decode().splitlines() if line.strip()]
    assert problems
    assert all("camelCase" in line for line in problems), problems


wire_int = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # anything msgpack carries
text = st.text(max_size=20)
nodes = st.sampled_from([NODE, "gpu-2"])
reports = st.builds(
    UsageSample,
    node=nodes,
    pod_uid=text,
    namespace=text,
    pod=text,
    container=text,
    device_uuid=text,
    used_bytes=wire_int,
    limit_bytes=wire_int,
    sm_util_percent=wire_int,
    at_ns=wire_int,
    vdevice_index=st.none() | wire_int,
    context_bytes=st.none() | wire_int,
    last_kernel_at_s=st.none() | wire_int,
)
devices = st.builds(PlacedDevice, uuid=text, type=text, usedmem_mib=wire_int, usedcores=wire_int)
containers = st.builds(
    ContainerPlacement, name=text, init=st.booleans(), devices=st.lists(devices, max_size=3).map(tuple)
)
placements = st.builds(
    PlacementDecision,
    pod_uid=text,
    namespace=text,
    name=text,
    node=nodes,
    bind_time_ns=wire_int,
    containers=st.lists(containers, max_size=3).map(tuple),
)


@settings(max_examples=80, deadline=None)
@given(events=st.lists(placements | reports, max_size=10))
def test_any_field_values_fold_and_render_to_a_parseable_exposition(events: list[Event]) -> None:
    state = apply(ClusterState(), inventory(), START_NS)
    for event in events:
        state = apply(state, event, START_NS)
    body = TextRenderer().render(collect(state, scrape(legacy=True)))
    assert parse(body.decode())  # the text format holds whatever the publishers sent
