"""The extender's FastAPI application: ``create_app(settings)`` assembles routers and the lifespan.

The lifespan opens the Kubernetes client, starts the pod/node/quota watches that keep the ledger current,
the event and lock-release workers, leader election, and the NATS connection (in the background: the
extender serves without NATS). Every task belongs to one TaskGroup and is cancelled after ``yield``.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from fastapi import FastAPI
from kubernetes import client

from hami_common import subjects
from hami_common.bus import Bus, Delivery, placement_stream
from hami_common.errors import HamiError
from hami_common.events import AllocationResult
from hami_common.kube import (
    Backoff,
    EventRecorder,
    KubeClient,
    LeaderElector,
    LeaseFollower,
    WatchCache,
    node_source,
    pod_source,
    quota_source,
)
from hami_common.vendors import device_families
from hami_extender.binder import Binder
from hami_extender.deps import State
from hami_extender.families import Families
from hami_extender.handoff import NodeHandoff
from hami_extender.handshake import NodeHandshakes
from hami_extender.leadership import Leadership
from hami_extender.ledger import Ledger
from hami_extender.nominations import Nominations
from hami_extender.notices import NoticeQueue
from hami_extender.placer import Placer, request_of
from hami_extender.preemptor import Budget, Preemptor
from hami_extender.publisher import PlacementPublisher
from hami_extender.readiness import Readiness
from hami_extender.role import RoleLabel
from hami_extender.routes import health
from hami_extender.routes.extender import ExtenderApp
from hami_extender.settings import ExtenderSettings
from hami_extender.sync import LedgerSync, placed_over_bus
from hami_extender.timings import FilterTimes

__all__ = ["create_app"]

log = logging.getLogger(__name__)

_BUS_RETRY_S = 30.0
_STREAM_RETRY_S = 2.0


def _now() -> datetime:
    return datetime.now(UTC)


def _local_now() -> datetime:
    return datetime.now().astimezone()


async def _keep_bus(settings: ExtenderSettings, publisher: PlacementPublisher, binder: Binder) -> None:
    """Connect to NATS (retrying forever), declare the placement stream, follow allocation results."""

    async def on_allocated(event: AllocationResult, delivery: Delivery) -> None:
        binder.allocated(event.pod_uid, event.ok)

    while True:
        try:
            bus = await Bus.connect(settings, give_up_after=_BUS_RETRY_S)
            break
        except HamiError as err:
            log.warning("NATS unreachable, scheduling goes on without placements on the bus: %s", err)
    try:
        # Only the extender declares the stream (node agents may not): keep trying until it stands, e.g.
        # while a NATS cluster elects its JetStream leader, or the bus answers slowly after a restart.
        while True:
            try:
                await bus.ensure_stream(placement_stream(settings.placement_replicas))
                break
            except HamiError as err:
                log.warning("placement stream not declared yet, retrying in %.0fs: %s", _STREAM_RETRY_S, err)
                await asyncio.sleep(_STREAM_RETRY_S)
        await bus.subscribe(subjects.wildcard(subjects.ALLOCATED), AllocationResult, on_allocated)
        publisher.bus = bus
        await asyncio.Event().wait()  # until cancelled
    finally:
        publisher.bus = None
        await bus.drain()


async def _freeze_after_sync(readiness: Readiness) -> None:
    """Once the caches hold the cluster, move it out of the collector's sight: a full collection over
    tens of thousands of cached pods would otherwise land in some request's latency."""
    for event in readiness.events:
        await event.wait()
    gc.collect()
    gc.freeze()


def create_app(settings: ExtenderSettings | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[State]:
        s = settings or ExtenderSettings()
        async with KubeClient.from_settings(s.kube()) as kube:
            backoff = Backoff(initial=0.2, cap=10.0)
            pods = WatchCache(pod_source(kube), backoff=backoff, name="pods")
            nodes = WatchCache(node_source(kube, label_selector=s.node_label_selector), backoff=backoff, name="nodes")
            quotas = WatchCache(quota_source(kube), backoff=backoff, name="resourcequotas")
            families = Families(device_families(s.resource_config(), s.device_config().families))
            log.info("device families: %s", ", ".join(f.word for f in families.configured))
            ledger = Ledger(mig_allowlist=s.device_config().mig_profile_allowlist, family_words=families.words)
            notices = NoticeQueue(successes=s.success_events)
            publisher = PlacementPublisher(timeout=s.publish_timeout)
            filter_times = FilterTimes()
            binder = Binder(
                ledger=ledger,
                handoff=NodeHandoff(expiry=s.node_lock_timeout),
                kube=kube,
                cached_pod=pods.get,
                cached_node=nodes.get,
                publisher=publisher,
                notices=notices,
                clock=_now,
                resources=s.resource_config(),
                handoff_wait=s.handoff_wait,
                call_timeout=s.kube_timeout,
                filter_times=filter_times,
                scheduler_name=s.scheduler_name,
                families=families,
            )
            handshakes = NodeHandshakes(
                clock=_local_now, leading=lambda: leadership.leading, resource=s.resource_config().count_name
            )
            sync = LedgerSync(
                ledger,
                on_pod_gone=binder.pod_done,
                on_bind_settled=binder.pod_done,
                handshakes=handshakes,
                resources=s.resource_config(),
                families=families,
            )
            pods.add_handler(sync.on_pod)
            nodes.add_handler(sync.on_node)
            nodes.add_handler(binder.on_node)
            quotas.add_handler(sync.on_quota)
            elector = _elector(s, kube)
            if elector is not None and s.role_label:
                elector.on_change = RoleLabel(kube, s.lease_namespace, s.candidate()).on_change
            leadership = Leadership(identity=s.candidate(), elector=elector)
            nominations = Nominations(
                request_of=functools.partial(request_of, config=s.resource_config(), families=families),
                defaults=s.policies(),
                plan=families.plan,
            )
            pods.add_handler(nominations.on_pod)
            placer = Placer(
                ledger=ledger,
                pods=kube,
                notices=notices,
                clock=_now,
                defaults=s.policies(),
                resources=s.resource_config(),
                patch_timeout=s.kube_timeout,
                filter_times=filter_times,
                grant_key=s.grant_key(),
                nominations=nominations,
                families=families,
                bus_node=lambda name: placed_over_bus(nodes.get("", name)),
                refusals=publisher.offer_refusal,
            )
            preemptor = Preemptor(
                ledger=ledger,
                cached_pod=pods.get,
                budgets=functools.partial(_budgets, kube),
                defaults=s.policies(),
                resources=s.resource_config(),
                families=families,
            )
            recorder = EventRecorder(kube, component=s.scheduler_name, host=s.candidate())
            readiness = Readiness(events=(pods.synced, nodes.synced), wait=s.sync_wait)
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(pods.run(), name="watch:pods"),
                    tg.create_task(nodes.run(), name="watch:nodes"),
                    tg.create_task(quotas.run(), name="watch:quotas"),
                    tg.create_task(notices.run(recorder), name="events"),
                    tg.create_task(binder.run_unlocks(), name="unlocks"),
                    tg.create_task(_keep_bus(s, publisher, binder), name="bus"),
                    tg.create_task(publisher.run_refusals(), name="refusals"),
                    tg.create_task(_freeze_after_sync(readiness), name="gc-freeze"),
                    tg.create_task(handshakes.run_writes(kube, s.kube_timeout), name="handshakes"),
                    tg.create_task(
                        handshakes.run_passes(nodes.get, sync.judge_again, s.node_pass_interval), name="node-passes"
                    ),
                ]
                if elector is not None:
                    tasks.append(tg.create_task(elector.run(), name="leader-election"))
                try:
                    yield {
                        "settings": s,
                        "ledger": ledger,
                        "placer": placer,
                        "binder": binder,
                        "preemptor": preemptor,
                        "leadership": leadership,
                        "publisher": publisher,
                        "readiness": readiness,
                        "handshakes": handshakes,
                    }
                finally:
                    for task in tasks:
                        task.cancel()

    app = ExtenderApp(lifespan=lifespan, title="hami-extender")
    app.include_router(health.router)
    return app


async def _budgets(kube: KubeClient) -> list[Budget]:
    """Every PodDisruptionBudget (the scheduler's account may read them: kube-scheduler preempts with them)."""
    api = client.PolicyV1Api(kube.api_client)
    budgets, _ = await kube.list_all("poddisruptionbudgets", Budget, api.list_pod_disruption_budget_for_all_namespaces)
    return budgets


def _elector(s: ExtenderSettings, kube: KubeClient) -> LeaderElector | LeaseFollower | None:
    if not s.leader_elect:
        return None
    retry = max(s.lease_duration / 7.5, 0.1)
    if s.leader_follow:  # kube-scheduler's identity is "<host name>_<uuid>"
        return LeaseFollower(
            leases=kube, namespace=s.lease_namespace, name=s.lease_name, prefix=f"{s.candidate()}_", retry_period=retry
        )
    return LeaderElector(
        leases=kube,
        namespace=s.lease_namespace,
        name=s.lease_name,
        identity=s.candidate(),
        lease_duration=s.lease_duration,
        renew_deadline=s.lease_duration * 2 / 3,
        retry_period=retry,
    )
