"""Lease-based leader election (coordination.k8s.io/v1), in the manner of client-go's leaderelection.

:func:`decide` is the pure rule: given the lease as last read, when it was observed and now, should this
candidate take it, renew it, or wait? :class:`LeaderElector` is the thin loop around it. A candidate may
take the lease when it does not exist, when it holds it already, or when the holder has not renewed it
within ``leaseDurationSeconds`` of *our* observation (clocks of different hosts are never compared).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from msgspec.structs import replace

from hami_common.errors import HamiError, NotFound
from hami_common.kube._types import Lease, LeaseSpec, ObjectMeta

__all__ = ["Action", "LeaderElector", "LeaseFollower", "LeasePort", "decide", "holds_lease"]

log = logging.getLogger(__name__)


class LeasePort(Protocol):
    async def get_lease(self, namespace: str, name: str) -> Lease: ...
    async def create_lease(self, lease: Lease) -> Lease: ...
    async def replace_lease(self, lease: Lease) -> Lease: ...


class Action(enum.Enum):
    CREATE = "create"
    TAKE = "take"  # the lease expired or was released: become its holder
    RENEW = "renew"
    WAIT = "wait"  # someone else holds a live lease


def decide(lease: Lease | None, identity: str, observed_at: float, now: float) -> Action:
    """What ``identity`` should do with ``lease``, first seen unchanged at monotonic ``observed_at``."""
    if lease is None:
        return Action.CREATE
    holder = lease.spec.holder_identity or ""
    if holder == identity:
        return Action.RENEW
    duration = lease.spec.lease_duration_seconds or 0
    if not holder or observed_at + duration <= now:
        return Action.TAKE
    return Action.WAIT


def holds_lease(lease: Lease, prefix: str, observed_at: float, now: float) -> bool:
    """HAMi's observer rule (hami-protocol §4.3): the holder identity starts with ``prefix`` (the host
    name) and the lease, as observed, has not expired."""
    holder = lease.spec.holder_identity or ""
    duration = lease.spec.lease_duration_seconds or 0
    return bool(holder) and holder.startswith(prefix) and observed_at + duration > now


async def _every(period: float, step: Callable[[], Awaitable[bool]], finally_: Callable[[], object]) -> None:
    try:
        while True:
            await step()
            await asyncio.sleep(period)
    finally:
        finally_()


def _version(lease: Lease) -> str:
    return lease.metadata.resource_version


def _micro_time(now: dt.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(eq=False)
class LeaderElector:
    """Holds the lease ``namespace/name`` for ``identity`` while it can. ``is_leader`` tells the state;
    ``on_change(True|False)`` runs on every transition."""

    leases: LeasePort
    namespace: str
    name: str
    identity: str
    lease_duration: int = 15
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    on_change: Callable[[bool], None] | None = None
    monotonic: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], dt.datetime] = field(default=lambda: dt.datetime.now(dt.UTC))
    is_leader: bool = False
    _seen: Lease | None = None
    _observed_at: float = 0.0
    _renewed_at: float = 0.0

    async def run(self) -> None:
        """Try to acquire or renew every ``retry_period`` until cancelled; step down when cancelled."""
        await _every(self.retry_period, self.step, lambda: self._set(False))

    async def step(self) -> bool:
        """One round: read the lease, act on :func:`decide`; return whether this candidate leads now."""
        now = self.monotonic()
        try:
            current: Lease | None = await self.leases.get_lease(self.namespace, self.name)
        except NotFound:
            current = None
        except HamiError as err:
            log.warning("lease %s/%s unreadable: %s", self.namespace, self.name, err)
            return self._expire(now)
        if current is None or self._seen is None or _version(current) != _version(self._seen):
            self._seen, self._observed_at = current, now
        action = decide(current, self.identity, self._observed_at, now)
        if action is Action.WAIT:
            return self._set(False)
        stamp = _micro_time(self.wall_clock())
        try:
            if current is None:
                written = await self.leases.create_lease(self._new_lease(stamp))
            else:
                written = await self.leases.replace_lease(self._updated(current, action, stamp))
        except HamiError as err:  # Conflict: lost the race; others: the apiserver is away
            log.info("lease %s/%s not written: %s", self.namespace, self.name, err)
            return self._expire(now)
        self._seen, self._observed_at, self._renewed_at = written, now, now
        return self._set(True)

    def _expire(self, now: float) -> bool:
        """A leader that cannot renew keeps leading only until ``renew_deadline`` after its last renewal,
        which is before any other candidate may take the lease (``lease_duration``)."""
        if self.is_leader and now - self._renewed_at < self.renew_deadline:
            return True
        return self._set(False)

    def _new_lease(self, stamp: str) -> Lease:
        return Lease(
            metadata=ObjectMeta(name=self.name, namespace=self.namespace),
            spec=LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=self.lease_duration,
                acquire_time=stamp,
                renew_time=stamp,
                lease_transitions=0,
            ),
        )

    def _updated(self, current: Lease, action: Action, stamp: str) -> Lease:
        spec = replace(
            current.spec, holder_identity=self.identity, lease_duration_seconds=self.lease_duration, renew_time=stamp
        )
        if action is Action.TAKE:
            spec = replace(spec, acquire_time=stamp, lease_transitions=(current.spec.lease_transitions or 0) + 1)
        return replace(current, spec=spec)

    def _set(self, leading: bool) -> bool:
        if leading != self.is_leader:
            self.is_leader = leading
            log.info(
                "lease %s/%s: %s is %s", self.namespace, self.name, self.identity, "leader" if leading else "not leader"
            )
            if self.on_change is not None:
                self.on_change(leading)
        return leading


@dataclass(eq=False)
class LeaseFollower:
    """Leads while another process holds the lease under an identity that starts with ``prefix``.

    HAMi's extender never campaigns: it sits in the pod of a kube-scheduler replica and reserves only
    while that replica holds the scheduler's Lease (whose identity is ``<host name>_<uuid>``), so the
    scheduler that calls it and the extender that reserves are always the same pair. Same interface as
    :class:`LeaderElector` (``run``, ``is_leader``, ``on_change``); it never writes the lease.
    """

    leases: LeasePort
    namespace: str
    name: str
    prefix: str
    retry_period: float = 1.0
    on_change: Callable[[bool], None] | None = None
    monotonic: Callable[[], float] = time.monotonic
    is_leader: bool = False
    _seen: Lease | None = None
    _observed_at: float = 0.0

    async def run(self) -> None:
        """Look at the lease every ``retry_period`` until cancelled; stop leading when cancelled."""
        await _every(self.retry_period, self.step, lambda: self._set(False))

    async def step(self) -> bool:
        now = self.monotonic()
        try:
            current = await self.leases.get_lease(self.namespace, self.name)
        except NotFound:
            self._seen = None
            return self._set(False)
        except HamiError as err:  # the apiserver is away: trust what was seen until it expires
            log.warning("lease %s/%s unreadable: %s", self.namespace, self.name, err)
            return self._set(self._seen is not None and holds_lease(self._seen, self.prefix, self._observed_at, now))
        if self._seen is None or _version(current) != _version(self._seen):
            self._seen, self._observed_at = current, now
        return self._set(holds_lease(current, self.prefix, self._observed_at, now))

    def _set(self, leading: bool) -> bool:
        if leading != self.is_leader:
            self.is_leader = leading
            log.info(
                "lease %s/%s: holder %s; %s* is %s",
                self.namespace, self.name, self._seen.spec.holder_identity if self._seen else None,
                self.prefix, "leader" if leading else "not leader",
            )  # fmt: skip
            if self.on_change is not None:
                self.on_change(leading)
        return leading
