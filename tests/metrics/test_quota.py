"""HAMi's quota families from the webhook's quota snapshots (issue 18.6; hami-protocol §6.1)."""

from __future__ import annotations

from hami_common import subjects
from hami_common.bus import Bus
from hami_common.events import QuotaResource, QuotaUsage
from hami_metrics.settings import MetricsSettings

from .conftest import FakeClock, Served, labels, series, serve

ZONE = {"zone": "vGPU"}

MEM = "nvidia.com/gpumem"
CORES = "nvidia.com/gpucores"


def snapshot(namespace: str, *resources: QuotaResource, at_ns: int = 1) -> QuotaUsage:
    return QuotaUsage(namespace=namespace, resources=resources, at_ns=at_ns)


async def test_quota_used_and_limit_per_namespace_and_resource(served: Served) -> None:
    await served.publish(
        subjects.admission("team-a"),
        snapshot("team-a", QuotaResource(name=MEM, used=1500, limit=4000), QuotaResource(name=CORES, used=30)),
    )
    samples = await served.scrape()
    assert series(samples, "hami_resource_quota_used") == {
        labels(namespace="team-a", quota_name=MEM, limit="4000", **ZONE): 1500,
        labels(namespace="team-a", quota_name=CORES, limit="", **ZONE): 30,
    }
    assert series(samples, "hami_resource_quota_limit") == {labels(namespace="team-a", quota_name=MEM, **ZONE): 4000}
    assert not series(samples, "QuotaUsed"), "the legacy name only behind --legacy-metrics"


async def test_a_newer_snapshot_replaces_the_namespace_and_an_empty_one_removes_it(served: Served) -> None:
    await served.publish(subjects.admission("team-a"), snapshot("team-a", QuotaResource(name=MEM, used=1, limit=9)))
    await served.publish(subjects.admission("team-b"), snapshot("team-b", QuotaResource(name=MEM, used=2, limit=9)))
    await served.publish(subjects.admission("team-a"), snapshot("team-a", QuotaResource(name=MEM, used=5, limit=9)))
    used = series(await served.scrape(), "hami_resource_quota_used")
    assert {dict(k)["namespace"]: v for k, v in used.items()} == {"team-a": 5, "team-b": 2}
    await served.publish(subjects.admission("team-a"), snapshot("team-a"))
    used = series(await served.scrape(), "hami_resource_quota_used")
    assert {dict(k)["namespace"] for k in used} == {"team-b"}


async def test_legacy_quota_used_behind_the_switch(settings: MetricsSettings, bus: Bus, clock: FakeClock) -> None:
    legacy = MetricsSettings(nats_url=settings.nats_url, legacy_metrics=True)
    async with serve(legacy, bus, clock) as running:
        await running.publish(
            subjects.admission("team-a"), snapshot("team-a", QuotaResource(name=MEM, used=7, limit=8))
        )
        samples = await running.scrape()
    assert series(samples, "QuotaUsed") == {
        labels(quotanamespace="team-a", quotaName=MEM, limit="8", **ZONE): 7,
    }
