"""The web page in headless Chromium against the local stack (NATS, the services, simulated nodes of every
vendor): each view loads, shows what ``hami status`` shows at the same moment, links a pod to its card and
back, says "no data" where nothing was reported, and says why a pending pod waits.

Set ``HAMI_SCREENSHOT_DIR`` to keep the screenshots (docs/img's come from here); otherwise they go to tmp_path.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import httpx
import pytest
import yaml
from selenium.webdriver.remote.webdriver import WebDriver

from hami_cli.report import Fleet
from hami_cli.status import Overview, build_overview, parse_usage
from hami_common.kube import FAILED_SCHEDULING
from hami_sim.stack import LocalCluster, StackConfig
from hami_sim.stack.audit import gpu_pod
from hami_sim.waiting import eventually
from tests.e2e.conftest import sockdir

from .conftest import Browser

__all__ = ["sockdir"]  # the e2e tests' fixture: a short folder for the stack's unix sockets

VENDORS: Final = ("nvidia", "ascend", "cambricon", "hygon")
TOO_BIG_MIB: Final = 10_000_000  # more memory than any simulated card: the pod stays pending
pytestmark = pytest.mark.timeout(240)


@pytest.fixture
async def stack(tmp_path: Path, sockdir: Path) -> AsyncIterator[LocalCluster]:
    config = StackConfig(
        workdir=tmp_path / "stack",
        sockdir=sockdir,
        nodes=2,
        gpus_per_node=2,
        vendors=VENDORS,
        vendor_devices_per_node=2,
        node_hosts=0,
    )
    async with LocalCluster(config) as running:
        yield running


@pytest.fixture
async def browser(chromium: WebDriver, stack: LocalCluster) -> Browser:
    return Browser(chromium, stack.metrics_url.removesuffix("/metrics") + "/ui/")


async def status_now(stack: LocalCluster) -> Overview:
    """What ``hami status`` reports: the same function over the same apiserver and /metrics."""
    nodes, _ = await stack.kube.list_nodes()
    pods, _ = await stack.kube.list_pods()
    events = await stack.kube.list_events(field_selector=f"reason={FAILED_SCHEDULING}")
    async with httpx.AsyncClient(timeout=10) as client:
        usage = parse_usage((await client.get(stack.metrics_url)).text)
    config = stack.config.device_config()
    fleet = Fleet(config.families, config.resources)
    return build_overview(stack.api.url, nodes, pods, events, usage, fleet=fleet, metrics_url=stack.metrics_url)


async def submit_pods(stack: LocalCluster) -> tuple[list[str], set[str]]:
    """Three placed GPU pods and one that cannot fit anywhere; (placed uids, the pending pod's possible keys:
    its uid, or namespace_name when the webhook met it before the apiserver gave it one)."""
    placed = [
        await stack.submit(gpu_pod("train-a", mem=3000, cores=30)),
        await stack.submit(gpu_pod("train-b", mem=5000, cores=20)),
        await stack.submit(gpu_pod("infer-c", mem=1000, cores=10, namespace="team-b")),
    ]
    uids = [p["metadata"]["uid"] for p in placed]
    pending = await stack.submit(gpu_pod("too-big", mem=TOO_BIG_MIB))
    async with asyncio.timeout(60):
        await stack.wait_admitted(uids)
    return uids, {pending["metadata"]["uid"], "default_too-big"}


async def report_usage(stack: LocalCluster, used_mib: int, utilization: int) -> str:
    """The first card of the stack's inventory reports this usage (the fake inventory is NVML's stand-in, re-read
    when it changes, and the node agent samples it like NVML); returns the card's uuid."""
    path = stack.config.inventory_file
    document = yaml.safe_load(await asyncio.to_thread(path.read_text))
    first = document["nodes"][stack.config.node_names()[0]][0]
    first.update(used_mib=used_mib, utilization=utilization)
    staged = path.with_suffix(".tmp")
    await asyncio.to_thread(staged.write_text, yaml.safe_dump(document, sort_keys=False))
    staged.replace(path)  # the readers never see half a file
    return str(first["uuid"])


def screenshot_dir(tmp_path: Path) -> Path:
    return Path(os.environ.get("HAMI_SCREENSHOT_DIR") or tmp_path / "screenshots")


async def test_every_view_loads_and_agrees_with_hami_status(
    stack: LocalCluster, browser: Browser, tmp_path: Path
) -> None:
    placed, pending = await submit_pods(stack)

    async def page_knows_all() -> bool:
        await browser.open("workloads", "workloads")
        rows = await browser.values("#workloads tbody tr[data-uid]", "uid")
        return set(placed) <= rows.keys() and bool(pending & rows.keys())

    await eventually(page_knows_all, timeout=30, what="the page lists every submitted pod")
    used_card = await report_usage(stack, used_mib=1234, utilization=40)

    async def status_has_usage() -> Overview | None:
        status = await status_now(stack)
        gpu = next(g for g in status.gpus if g.uuid == used_card)
        return status if gpu.memory_used_mib == 1234 else None

    status = await eventually(status_has_usage, timeout=30, what="the card's sampled usage in hami status")
    await browser.open("cards", "cards")
    cards = await browser.values("#cards tbody tr[data-uuid]", "uuid")
    assert {g.uuid for g in status.gpus} == cards.keys()  # every card of every vendor, no more
    for gpu in status.gpus:
        row = cards[gpu.uuid]
        shown = (int(row["memory_mib"]), int(row["memory_booked_mib"]), int(row["cores_booked"]))
        assert shown == (gpu.memory_mib, gpu.memory_booked_mib, gpu.cores_booked), gpu.uuid
        # used memory: the same figure, or "no data" on both sides (never a 0 standing in for it)
        assert row["memory_used_mib"] == ("" if gpu.memory_used_mib is None else str(gpu.memory_used_mib)), gpu.uuid
    assert cards[used_card]["memory_used_mib"] == "1234"  # a sampled figure, not only "no data" on both sides

    await browser.open("overview", "overview")
    tiles = await browser.values("#view .tiles", "x")
    numbers = next(iter(tiles.values()))
    assert int(numbers["memory_booked_mib"]) == sum(g.memory_booked_mib for g in status.gpus)
    assert int(numbers["memory_mib"]) == sum(g.memory_mib for g in status.gpus)
    assert int(numbers["cards"]) == len(status.gpus)
    assert int(numbers["pods_pending"]) == 1
    models = await browser.text("#models")
    for vendor in ("NVIDIA", "Ascend", "MLU", "DCU"):  # every vendor the stack schedules
        assert vendor in models
    heat = await browser.script("return document.querySelectorAll('#heatmap a[data-card]').length")
    assert heat == len(status.gpus)
    await browser.screenshot(screenshot_dir(tmp_path) / "webui-overview.png")

    for route in ("nodes", "workloads", "quotas"):
        await browser.open(route, route)
        assert await browser.script("return document.getElementById('error')") is None, await browser.text()
    await browser.open("nodes", "nodes")
    nodes = await browser.values("#nodes tbody tr[data-node]", "node")
    assert set(nodes) == set(stack.config.node_names())


async def test_a_pod_links_to_its_card_and_back_and_no_data_is_said(
    stack: LocalCluster, browser: Browser, tmp_path: Path
) -> None:
    placed, pending = await submit_pods(stack)
    pod = placed[0]
    status = await status_now(stack)
    row = next(r for r in status.pods if r.pod == "default/train-a")
    card = row.devices[0].split("(", 1)[0]

    async def listed() -> bool:
        await browser.open("workloads", "workloads")
        rows = await browser.values("#workloads tbody tr[data-uid]", "uid")
        return pod in rows and bool(pending & rows.keys())

    await eventually(listed, timeout=30, what="the pod on the page")
    (waiting,) = pending & (await browser.values("#workloads tbody tr[data-uid]", "uid")).keys()
    await browser.follow(f'#workloads a[data-pod="{pod}"]', "workload")
    assert "default/train-a" in await browser.text("h1")
    grants = await browser.values("#grants tbody tr[data-uuid]", "uuid")
    assert list(grants) == [card]  # the card hami status names
    assert int(grants[card]["memory_mib"]) == 3000
    text = await browser.text()
    if "no usage report" in text:  # the simulated container has not reported: said, not drawn as 0
        assert "no data" in text
    await browser.screenshot(screenshot_dir(tmp_path) / "webui-workload.png")

    await browser.follow(f'#grants a[data-card="{card}"]', "card")
    holders = await browser.values("#holders tbody tr[data-uid]", "uid")
    assert pod in holders
    await browser.follow(f'#holders a[data-pod="{pod}"]', "workload")
    assert "default/train-a" in await browser.text("h1")

    await browser.follow("a[data-node]", "node")
    assert pod in await browser.values("#workloads tbody tr[data-uid]", "uid")

    await browser.open(f"workload/{waiting}", "workload")
    reason = await browser.text("#reason")
    assert "Why it waits" in reason
    assert "not placed yet" in reason

    async def refused() -> str | None:  # the extender's Filter refusal, from the bus
        await browser.open(f"workload/{waiting}", "workload")
        text = await browser.text("#reason")
        return text if "no node fits" in text else None

    because = await eventually(refused, timeout=30, what="the filter's reasons on the page")
    assert "CardInsufficientMemory" in because


async def test_a_bad_link_says_what_is_missing(stack: LocalCluster, browser: Browser) -> None:
    await browser.open("card/GPU-does-not-exist", "card")
    assert "404" in await browser.text("#error")
    await browser.open("node/Not_A_Name", "node")
    assert "422" in await browser.text("#error")
