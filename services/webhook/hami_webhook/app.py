"""The webhook's FastAPI application, assembled in :func:`create_app`.

The lifespan opens what the routes use: the rules' policy, the watch caches (quota, GPU pods,
namespaces) when ``watch_cluster`` is on, and the best-effort event publisher when ``publish_events`` is
on. Long-lived tasks run in one TaskGroup that the lifespan cancels on shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig

from hami_common.bus import Bus
from hami_common.kube import KubeClient
from hami_common.settings import load
from hami_webhook.claimtemplates import KubeTemplates
from hami_webhook.cluster import ClusterState, parse_label_rule
from hami_webhook.deps import State
from hami_webhook.dra import dra_policy
from hami_webhook.publisher import EventPublisher, Publisher
from hami_webhook.quotanews import announce_quotas
from hami_webhook.reviewer import Reviewer
from hami_webhook.routes import admission, health
from hami_webhook.settings import WebhookSettings

__all__ = ["create_app"]

_NATS_GIVE_UP_S = 30.0
_NO_FRAMEWORK_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}


def _always() -> bool:
    return True


def create_app(settings: WebhookSettings | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[State]:
        s = settings if settings is not None else load(WebhookSettings, [])  # env is read here, once
        policy = s.policy()
        async with AsyncExitStack() as stack, asyncio.TaskGroup() as tg:
            tasks: list[asyncio.Task[None]] = []
            reviewer = Reviewer(policy, max_body_bytes=s.max_body_bytes)
            if s.dra:  # DRA mode (docs/dra.md): admitted GPU pods name templates, written through the apiserver
                writer = await stack.enter_async_context(KubeClient.from_settings(s))
                reviewer.policy, reviewer.templates = dra_policy(policy), KubeTemplates(writer)
            ready: Callable[[], bool] = _always
            if s.watch_cluster:
                kube = await stack.enter_async_context(KubeClient.from_settings(s))
                rule = parse_label_rule(s.disable_control_label)
                cluster = ClusterState(kube, rule, policy.devices)
                tasks.append(tg.create_task(cluster.run(), name="webhook caches"))
                reviewer.namespaces = cluster
                reviewer.roster = cluster
                ready = cluster.is_synced
            if s.publish_events:
                publisher = EventPublisher(capacity=s.event_queue, timeout=s.publish_timeout)

                async def connect() -> AbstractAsyncContextManager[Publisher]:
                    return await Bus.connect(s, give_up_after=_NATS_GIVE_UP_S)

                tasks.append(tg.create_task(publisher.run(connect), name="admission events"))
                reviewer.events = publisher
                if s.watch_cluster:
                    announcing = announce_quotas(
                        cluster.book, publisher, s.quota_announce_seconds, s.quota_refresh_seconds
                    )
                    tasks.append(tg.create_task(announcing, name="quota announcements"))
            try:
                yield {"settings": s, "reviewer": reviewer, "ready": ready}
            finally:
                for task in tasks:
                    task.cancel()

    app = FastAPI(
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        # One span per admission, the webhook's own (the pod's trace starts there); no per-request HTTP
        # spans, metrics or log records from FastAPI: they would cost more than the admission itself.
        telemetry=_NO_FRAMEWORK_TELEMETRY,
    )
    app.include_router(admission.router)
    app.include_router(health.router)
    return app
