"""The scheduler pod's role label, as HAMi's scheduler writes it: ``hami.io/scheduler-role=leader|follower``.

Operators (and Services or monitors that select on it) see at a glance which replica serves kube-scheduler.
The extender labels its own pod whenever its leadership changes; a failed write is retried on the next
change and never affects scheduling.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from hami_common.annotations import SCHEDULER_ROLE, SCHEDULER_ROLE_FOLLOWER, SCHEDULER_ROLE_LEADER
from hami_common.errors import HamiError
from hami_common.kube import KubeClient, MetadataPatch, PatchMeta

__all__ = ["RoleLabel"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class RoleLabel:
    kube: KubeClient
    namespace: str
    pod: str
    written: str = ""  # the role last written
    _pending: set[asyncio.Task[None]] = field(default_factory=set)

    def on_change(self, leading: bool) -> None:
        """The elector's callback: write the new role in the background."""
        task = asyncio.get_running_loop().create_task(self.write(leading))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def write(self, leading: bool) -> None:
        role = SCHEDULER_ROLE_LEADER if leading else SCHEDULER_ROLE_FOLLOWER
        patch = MetadataPatch(metadata=PatchMeta(labels={SCHEDULER_ROLE: role}))
        try:
            await self.kube.patch_pod(self.namespace, self.pod, patch)
        except HamiError as err:
            log.warning("pod %s/%s not labelled %s=%s: %s", self.namespace, self.pod, SCHEDULER_ROLE, role, err)
            return
        self.written = role
