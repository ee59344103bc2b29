"""Who may reserve: the Lease holder (hami-protocol §4.3), or this process when election is off."""

from __future__ import annotations

from dataclasses import dataclass

from hami_common.kube import LeaderElector, LeaseFollower

__all__ = ["Leadership"]


@dataclass(eq=False)
class Leadership:
    identity: str
    elector: LeaderElector | LeaseFollower | None = None  # None: election is off, this process always leads

    @property
    def leading(self) -> bool:
        return self.elector is None or self.elector.is_leader
