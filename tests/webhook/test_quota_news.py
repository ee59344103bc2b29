"""The webhook announces each namespace's GPU quota on the bus, for the metrics service (issue 18.6)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hami_common import subjects
from hami_common.annotations import DEVICES_ALLOCATED, VGPU_NODE
from hami_common.bus import Bus, Delivery, EmbeddedNats
from hami_common.events import AdmissionEvent, AdmissionMessage, QuotaResource, QuotaUsage
from hami_common.kube import Change
from hami_common.resources import GPU, GPU_CORES, GPU_MEMORY
from hami_webhook.publisher import EventPublisher
from hami_webhook.quota import QuotaBook
from hami_webhook.quotanews import announce_round
from tests.webhook.conftest import TlsFiles, cluster_settings
from tests.webhook.support import container, pod, served
from tests.webhook.test_quota import CORES_LIMIT, MEM_LIMIT, placed, quota


def test_a_round_offers_the_changed_namespaces_then_only_what_changes() -> None:
    book = QuotaBook()
    publisher = EventPublisher()
    book.on_quota(Change("ADDED", quota("gpu", {MEM_LIMIT: "2000", CORES_LIMIT: "100"})))
    book.on_pod(Change("ADDED", placed("a", "GPU-a,NVIDIA,1000,30:;")))
    book.on_pod(Change("ADDED", placed("free", "GPU-a,NVIDIA,10,1:;", namespace="no-quota")))
    assert announce_round(book, publisher, everything=False, at_ns=7) == 1
    assert announce_round(book, publisher, everything=False, at_ns=8) == 0, "nothing changed since"
    assert announce_round(book, publisher, everything=True, at_ns=9) == 1, "a refresh resends every quota"
    book.on_quota(Change("DELETED", quota("gpu", {})))
    assert announce_round(book, publisher, everything=False, at_ns=10) == 1
    assert book.usage("team-a", 10) == QuotaUsage(namespace="team-a", resources=(), at_ns=10)


def test_the_snapshot_lists_each_limited_resource_with_its_use() -> None:
    book = QuotaBook()
    book.on_quota(Change("ADDED", quota("gpu", {MEM_LIMIT: "2000"})))
    book.on_pod(Change("ADDED", placed("a", "GPU-a,NVIDIA,1000,30:;")))
    assert book.usage("team-a", 1).resources == (QuotaResource(name=GPU_MEMORY, used=1000, limit=2000),)


async def test_a_webhook_watching_the_cluster_publishes_quota_snapshots(
    core: Any, kubeconfig: Path, tls_files: TlsFiles, bus: Bus, nats_server: EmbeddedNats
) -> None:
    received: asyncio.Queue[QuotaUsage] = asyncio.Queue()

    async def on_message(event: AdmissionEvent | QuotaUsage, delivery: Delivery) -> None:
        if isinstance(event, QuotaUsage):
            await received.put(event)

    await bus.subscribe(subjects.wildcard(subjects.ADMISSION), AdmissionMessage, on_message)  # type: ignore[arg-type]
    core.create_namespace({"metadata": {"name": "team-a"}})
    hard = {MEM_LIMIT: "4000", CORES_LIMIT: "200"}
    core.create_namespaced_resource_quota("team-a", {"metadata": {"name": "gpu"}, "spec": {"hard": hard}})
    used = pod(container(limits={GPU: "1", GPU_MEMORY: "1500", GPU_CORES: "30"}), name="running", namespace="team-a")
    used["metadata"]["annotations"] = {DEVICES_ALLOCATED: "GPU-a,NVIDIA,1500,30:;", VGPU_NODE: "node-1"}
    core.create_namespaced_pod("team-a", used)
    settings = cluster_settings(
        tls_files, kubeconfig, publish_events=True, nats_url=nats_server.url, quota_announce_seconds=0.05
    )
    with served(settings, tls_files.cert):

        async def settled() -> QuotaUsage:
            while True:
                news = await received.get()
                if news.resources and news.resources[0].used == 1500:
                    return news

        news = await asyncio.wait_for(settled(), 20)
    assert news.namespace == "team-a"
    assert news.resources == (
        QuotaResource(name=GPU_MEMORY, used=1500, limit=4000),
        QuotaResource(name=GPU_CORES, used=30, limit=200),
    )
