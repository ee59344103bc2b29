"""Issue 28 item 9: forged AdmissionReviews.

Anyone who reaches the webhook can post reviews. The webhook answers them (an answer changes nothing in the
cluster) but announces on the bus only reviews of namespaces its watch knows: 2,000 forged ones naming
made-up namespaces used to become 2,000 never-pruned ``hami_scheduling_admissions_total`` series.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hami_common import subjects
from hami_common.bus import Bus, Delivery, EmbeddedNats
from hami_common.events import AdmissionEvent, AdmissionMessage, QuotaUsage
from hami_metrics.aggregator import Aggregator
from hami_metrics.exposition import BuildInfo, Scrape, collect
from hami_metrics.staleness import Retention
from hami_metrics.state import NS_PER_S
from hami_metrics.textformat import TextRenderer
from tests.webhook.conftest import TlsFiles, cluster_settings
from tests.webhook.support import container, pod, review, served

FORGED = 2000
SERIES = "hami_scheduling_admissions_total{"


async def test_forged_reviews_of_unknown_namespaces_are_answered_but_make_no_series(
    core: Any, kubeconfig: Path, tls_files: TlsFiles, bus: Bus, nats_server: EmbeddedNats
) -> None:
    announced: asyncio.Queue[AdmissionEvent] = asyncio.Queue()

    async def on_message(event: AdmissionEvent | QuotaUsage, delivery: Delivery) -> None:
        if isinstance(event, AdmissionEvent):
            await announced.put(event)

    await bus.subscribe(subjects.wildcard(subjects.ADMISSION), AdmissionMessage, on_message)  # type: ignore[arg-type]
    aggregator = Aggregator(Retention(NS_PER_S * 90, NS_PER_S * 30, NS_PER_S * 900))
    await aggregator.subscribe(bus)
    core.create_namespace({"metadata": {"name": "team-a"}})
    settings = cluster_settings(tls_files, kubeconfig, publish_events=True, nats_url=nats_server.url)
    with served(settings, tls_files.cert) as webhook:
        for i in range(FORGED):
            forged = pod(container(), name=f"p{i}", namespace=f"forged-{i}")
            assert webhook.admit(review(forged, uid=f"f-{i}"))["allowed"] is True
        for i in range(2):
            assert webhook.admit(review(pod(container(), name=f"real-{i}", namespace="team-a")))["allowed"]

        async def real_ones() -> list[AdmissionEvent]:
            seen: list[AdmissionEvent] = []
            while sum(event.namespace == "team-a" for event in seen) < 2:
                seen.append(await announced.get())
            return seen

        seen = await asyncio.wait_for(real_ones(), 30)
    assert {event.namespace for event in seen} == {"team-a"}, "reviews of made-up namespaces were announced"
    scrape = Scrape(now_ns=aggregator.clock.now_ns(), build=BuildInfo(version="t"))
    text = TextRenderer().render(collect(aggregator.snapshot(), scrape)).decode()
    series = [line for line in text.splitlines() if line.startswith(SERIES)]
    assert series == ['hami_scheduling_admissions_total{namespace="team-a",result="allowed"} 2']
