"""The allocator's publisher of allocation results over a real nats-server: a connection nats-py closed
for good is replaced, results are dropped (counted) meanwhile, and nothing raises into the follow-up."""

from __future__ import annotations

import asyncio

from hami_allocator.service import LazyBus
from hami_common import subjects
from hami_common.bus import Bus, Delivery, EmbeddedNats
from hami_common.events import AllocationResult
from hami_common.settings import BusSettings
from hami_sim.waiting import eventually


def result(name: str) -> AllocationResult:
    return AllocationResult(
        pod_uid=f"uid-{name}",
        namespace="default",
        name=name,
        node="n1",
        container="main",
        ok=True,
        staged=True,
        at_ns=1,
    )


async def test_results_go_on_after_nats_py_closed_the_connection(nats_server: EmbeddedNats) -> None:
    settings = BusSettings(nats_url=nats_server.url, service_name="allocator-test")
    publisher = LazyBus(settings)
    connecting = asyncio.create_task(publisher.run())
    seen: list[str] = []

    async def on_result(event: AllocationResult, delivery: Delivery) -> None:
        seen.append(event.name)

    async with await Bus.connect(BusSettings(nats_url=nats_server.url, service_name="extender-test")) as listener:
        await listener.subscribe(subjects.allocated("n1"), AllocationResult, on_result)
        await listener.sync()
        try:
            await connecting
            assert publisher.bus is not None
            await publisher.publish(subjects.allocated("n1"), result("before"))
            await eventually(lambda: seen == ["before"])
            await publisher.bus.drain()  # closed for good, as nats-py leaves it after the server's -ERR
            await publisher.publish(subjects.allocated("n1"), result("while-closed"))  # dropped, no error
            assert publisher.dropped == 1

            async def reconnected() -> bool:
                return publisher.bus is not None and publisher.bus.connected

            await eventually(reconnected, what="a new connection")
            await publisher.publish(subjects.allocated("n1"), result("after"))
            await eventually(lambda: seen == ["before", "after"])
        finally:
            await publisher.close()
