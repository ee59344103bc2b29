"""The kube-scheduler stand-in as the stack runs it: a pod whose bind is in flight is *assumed*.

kube-scheduler puts a pod in its cache as assumed the moment a node is chosen, so the watch events its own
binding cycle causes (the extender's annotation patch) do not schedule the pod a second time.
:class:`hami_sim.scheduler.SchedulerDriver` re-queues such a pod and filters it again while the first bind
is still running, which makes the extender reserve it twice; this subclass adds the assumed set.
"""

from __future__ import annotations

from hami_common.kube import KubeClient, Pod
from hami_sim.scheduler import SchedulerDriver, Verdict

__all__ = ["AssumingDriver"]


class AssumingDriver(SchedulerDriver):
    def __init__(self, kube: KubeClient, extender_url: str, *, retry_after: float = 1.0) -> None:
        super().__init__(kube, extender_url, retry_after=retry_after)
        self.assumed: set[str] = set()

    def _is_ours_and_pending(self, pod: Pod) -> bool:
        return super()._is_ours_and_pending(pod) and pod.metadata.uid not in self.assumed

    async def schedule_one(self, pod: Pod) -> Verdict:
        verdict = await super().schedule_one(pod)
        if verdict.node:  # the bind task exists but has not run yet: nothing can re-queue the pod in between
            self.assumed.add(pod.metadata.uid)
        return verdict

    async def _bind(self, pod: Pod, node: str) -> None:
        uid = pod.metadata.uid
        try:
            await super()._bind(pod, node)
        finally:
            verdict = self.verdicts.get(uid)
            if verdict is None or verdict.error:  # the retry the base class scheduled may pick it up again
                self.assumed.discard(uid)
