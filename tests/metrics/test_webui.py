"""The web page's HTTP side: the page and its JSON over real HTTP, behind /metrics' token; bad paths answered
in FastAPI's form. (tests/webui drives the page itself in Chromium.)"""

from __future__ import annotations

import asyncio

import pytest

from hami_common import subjects
from hami_common.bus import Bus
from hami_common.events import AdmissionEvent, DeviceSample
from hami_metrics.settings import MetricsSettings

from .conftest import GPU_A, GPU_B, NODE, START_NS, FakeClock, Served, container, inventory, placement, serve, usage

MIB = 1 << 20


async def populate(served: Served) -> None:
    await served.publish(subjects.inventory(NODE), inventory())
    await served.publish(
        subjects.placement(NODE),
        placement("u1", container("main", (GPU_A, 1000, 30))),
        placement("u2", container("main", (GPU_B, 2000, 20))),
    )
    await served.publish(subjects.usage(NODE), usage("u1", GPU_A, used=300 * MIB))
    sample = DeviceSample(node=NODE, device_uuid=GPU_A, index=0, name="A100", memory_used_bytes=700 * MIB,
                          utilization_percent=12, at_ns=START_NS)  # fmt: skip
    await served.publish(subjects.usage(NODE), sample)


async def test_the_page_and_its_script_are_served_from_the_service(served: Served) -> None:
    page = await served.client.get("/ui/")
    assert page.status_code == 200
    assert 'src="static/app.js"' in page.text
    assert "http" not in page.text.split("<body>")[0].replace("http-equiv", "")  # nothing from elsewhere
    script = await served.client.get("/ui/static/app.js")
    assert script.status_code == 200
    assert "no data" in script.text
    assert (await served.client.get("/ui")).status_code in (200, 307)


async def test_the_api_shows_booked_and_used_and_no_data_where_nothing_was_reported(served: Served) -> None:
    await populate(served)
    overview = (await served.client.get("/ui/api/overview")).json()
    assert overview["overview"]["memory_booked_mib"] == 3000
    assert overview["overview"]["memory_used_mib"] == 700  # only card A has a sample
    assert overview["overview"]["cards_reporting"] == 1
    assert len(overview["cards"]) == 2
    cards = {c["uuid"]: c for c in (await served.client.get("/ui/api/cards")).json()}
    assert cards[GPU_B]["memory_used_mib"] is None
    card = (await served.client.get(f"/ui/api/cards/{GPU_A}")).json()
    assert [h["uid"] for h in card["detail"]["holders"]] == ["u1"]
    pod = (await served.client.get("/ui/api/workloads/u2")).json()
    assert pod["detail"]["pod"]["memory_used_mib"] is None
    assert [g["uuid"] for g in pod["detail"]["grants"]] == [GPU_B]
    node = (await served.client.get(f"/ui/api/nodes/{NODE}")).json()
    assert [c["uuid"] for c in node["cards"]] == [GPU_A, GPU_B]


async def test_a_pending_pod_is_a_workload_with_its_reason(served: Served) -> None:
    admitted = AdmissionEvent(pod_uid="p9", namespace="team-a", name="waits", allowed=True, gpu_containers=1,
                              at_ns=START_NS)  # fmt: skip
    await served.publish(subjects.admission("team-a"), admitted)
    rows = (await served.client.get("/ui/api/workloads")).json()
    assert [(r["name"], r["state"]) for r in rows] == [("waits", "pending")]
    assert "not placed yet" in rows[0]["reason"]


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/ui/api/nodes/no-such-node", 404),
        ("/ui/api/cards/GPU-nope", 404),
        ("/ui/api/workloads/0000-nope", 404),
        ("/ui/api/nodes/Bad_Name", 422),
        ("/ui/api/workloads/..%2Fetc", 404),  # no such route once the slash is decoded
        ("/ui/api/workloads/..etc", 422),
        ("/ui/api/cards/-leading-dash", 422),
        ("/ui/api/nodes/" + "a" * 254, 422),
    ],
)
async def test_unknown_and_malformed_ids_get_404_and_422(served: Served, path: str, code: int) -> None:
    reply = await served.client.get(path)
    assert reply.status_code == code, reply.text
    assert "detail" in reply.json()


async def test_the_api_needs_the_metrics_token_and_the_page_does_not(
    settings: MetricsSettings, bus: Bus, clock: FakeClock
) -> None:
    guarded = MetricsSettings(nats_url=settings.nats_url, metrics_token="s3cret")
    async with serve(guarded, bus, clock) as served:
        assert (await served.client.get("/ui/api/overview")).status_code == 401
        assert (await served.client.get("/metrics")).status_code == 401
        ok = await served.client.get("/ui/api/overview", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert (await served.client.get("/ui/")).status_code == 200  # no data in it: the script asks for the token


async def test_history_is_sampled_on_the_service_clock(settings: MetricsSettings, bus: Bus, clock: FakeClock) -> None:
    fast = MetricsSettings(nats_url=settings.nats_url, history_interval_s=0.05)
    async with serve(fast, bus, clock) as served:
        await populate(served)
        for _ in range(100):
            card = (await served.client.get(f"/ui/api/cards/{GPU_A}")).json()
            if card["history"] and len(card["history"]["t"]) >= 2:
                break
            await asyncio.sleep(0.05)
        history = card["history"]
        assert history["values"][history["fields"].index("memory_booked_mib")][-1] == 1000.0
        assert history["values"][history["fields"].index("memory_used_mib")][-1] == 700.0
        other = (await served.client.get(f"/ui/api/cards/{GPU_B}")).json()["history"]
        assert other["values"][other["fields"].index("memory_used_mib")][-1] is None  # no sample: a gap
