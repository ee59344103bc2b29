"""Announcing each namespace's GPU quota on the bus, for the metrics service's quota families (issue 18.6).

The webhook already watches ResourceQuotas and every pod's device annotation to enforce quota at admission
(:class:`~hami_webhook.quota.QuotaBook`), and already publishes on ``hami.admission.<namespace>``. Sending
the book's per-namespace snapshot there too (:class:`~hami_common.events.QuotaUsage`) gives the metrics
service ``hami_resource_quota_used``/``_limit`` without it watching the apiserver, without a new subject or
new NATS permissions, and without a second copy of the quota arithmetic.

Changed namespaces go out at most once per ``interval``; every namespace with a quota goes out every
``refresh`` as well, so a metrics service that (re)started, or missed a message, is right again soon.
"""

from __future__ import annotations

import asyncio
import time

from hami_common import subjects
from hami_common.errors import InvalidInput
from hami_webhook.publisher import EventPublisher
from hami_webhook.quota import QuotaBook

__all__ = ["announce_quotas", "announce_round"]


def announce_round(book: QuotaBook, publisher: EventPublisher, everything: bool, at_ns: int) -> int:
    """Offer the snapshots of the changed namespaces (of all quota namespaces when ``everything``); returns
    how many were offered."""
    names = set(book.take_changed())
    if everything:
        names.update(book.limited())
    offered = 0
    for namespace in sorted(names):
        try:
            subject = subjects.admission(namespace)
        except InvalidInput:
            continue  # not a namespace name: nothing to announce it on
        publisher.offer(subject, book.usage(namespace, at_ns))
        offered += 1
    return offered


async def announce_quotas(book: QuotaBook, publisher: EventPublisher, interval: float, refresh: float) -> None:
    """Until cancelled: changed namespaces every ``interval`` seconds, all of them every ``refresh``."""
    rounds_per_refresh = max(1, round(refresh / interval))
    round_no = 0
    while True:
        announce_round(book, publisher, round_no % rounds_per_refresh == 0, time.time_ns())
        round_no += 1
        await asyncio.sleep(interval)
