"""Load time of the metrics service's web page at 100 and 1,000 pods on 100 nodes, in headless Chromium.

One process runs an embedded nats-server and the metrics app under uvicorn (real HTTP on loopback, in a
thread, so the browser's requests are served while Selenium waits). The aggregator is given a synthetic
cluster: 100 nodes of 4 GPUs, a device sample per GPU, ``pods`` one-GPU pods spread over the nodes, half of
them with an interposer usage report. For each size:

* ``api_ms``: the median time of each JSON view (overview, cards, workloads, one workload), over ``--reps``;
* ``page_ms``: for the Overview, Cards and Workloads views, the median over ``--reps`` fresh page loads of the
  time from navigation start to the view drawn (the page records ``performance.now()`` when it is), in
  Debian's chromium with its chromedriver; ``null`` with the reason when they are missing.

    python benchmarks/webui_load.py [--quick] [--reps 5]

The last line is JSON: ``{"pods_100": {...}, "pods_1000": {...}, "browser": "..."}``. Nothing is asserted:
the machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Final

import httpx
import uvicorn

from hami_common.annotations import DeviceInfo
from hami_common.bus import EmbeddedNats
from hami_common.events import ContainerPlacement, DeviceSample, NodeInventory, PlacedDevice, PlacementDecision
from hami_common.events import UsageSample as Usage
from hami_metrics.aggregator import Aggregator
from hami_metrics.app import create_app
from hami_metrics.settings import MetricsSettings
from hami_sim.net import listening_socket

NODES: Final = 100
GPUS: Final = 4
SIZES: Final = (100, 1000)
VIEWS: Final = ("overview", "cards", "workloads")
CHROMIUM: Final = "/usr/bin/chromium"
CHROMEDRIVER: Final = "/usr/bin/chromedriver"
MIB: Final = 1 << 20


def seed(aggregator: Aggregator, pods: int) -> str:
    """The synthetic cluster, folded straight into the aggregator; returns one pod's uid."""
    now = time.time_ns()
    for n in range(NODES):
        node = f"node-{n:03d}"
        devices = tuple(
            DeviceInfo(id=f"GPU-{n:08x}-0000-4000-8000-{g:012x}", index=g, count=10, devmem=81920, devcore=100,
                       type="NVIDIA-A100", health=True)
            for g in range(GPUS)
        )  # fmt: skip
        aggregator.fold(NodeInventory(node=node, devices=devices, at_ns=now))
        for d in devices:
            aggregator.fold(DeviceSample(node=node, device_uuid=d.id, index=d.index, name="A100",
                                         memory_used_bytes=1000 * MIB, utilization_percent=40, at_ns=now))  # fmt: skip
    for p in range(pods):
        n, g = p % NODES, (p // NODES) % GPUS
        node, uuid, uid = f"node-{n:03d}", f"GPU-{n:08x}-0000-4000-8000-{g:012x}", f"pod-{p:05d}"
        device = PlacedDevice(uuid=uuid, type="NVIDIA", usedmem_mib=2000, usedcores=10)
        aggregator.fold(PlacementDecision(pod_uid=uid, namespace=f"team-{p % 7}", name=f"job-{p}", node=node,
                                          containers=(ContainerPlacement(name="main", devices=(device,)),),
                                          bind_time_ns=now))  # fmt: skip
        if p % 2 == 0:
            report = Usage(node=node, pod_uid=uid, namespace=f"team-{p % 7}", pod=f"job-{p}", container="main",
                           device_uuid=uuid, used_bytes=1500 * MIB, limit_bytes=2000 * MIB, at_ns=now)  # fmt: skip
            aggregator.fold(report)
    return "pod-00001"


class Served:
    """The metrics app under uvicorn in a thread of its own (its own event loop)."""

    def __init__(self, nats_url: str, aggregator: Aggregator) -> None:
        settings = MetricsSettings(nats_url=nats_url, http_host="127.0.0.1")
        self.sock = listening_socket()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(create_app(settings, aggregator=aggregator), log_config=None, access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])))

    def __enter__(self) -> Served:
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                return self
            time.sleep(0.05)
        raise RuntimeError("the metrics app did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def api_times(url: str, uid: str, reps: int) -> dict[str, float]:
    paths = {"overview": "/overview", "cards": "/cards", "workloads": "/workloads", "workload": f"/workloads/{uid}"}
    out = {}
    with httpx.Client(base_url=f"{url}/ui/api", timeout=30) as client:
        for name, path in paths.items():
            times = []
            for _ in range(reps):
                started = time.perf_counter()
                client.get(path).raise_for_status()
                times.append((time.perf_counter() - started) * 1000)
            out[name] = round(statistics.median(times), 1)
    return out


def browser() -> tuple[Any, str]:
    """(a Selenium driver, "") or (None, why not)."""
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        return None, f"{CHROMIUM} or {CHROMEDRIVER} not found (Debian's chromium and chromium-driver)"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,900",
                 f"--user-data-dir={tempfile.mkdtemp(prefix='hami-bench-chromium-')}"):  # fmt: skip
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER)), ""


def page_times(driver: Any, url: str, reps: int) -> dict[str, float]:
    out = {}
    for view in VIEWS:
        times = []
        for i in range(reps):
            driver.get(f"{url}/ui/?refresh=0&n={i}#/{view}")  # a new query string: a full load each time
            deadline = time.monotonic() + 30
            while True:
                state = driver.execute_script(
                    "const v = document.getElementById('view');"
                    "return [v.dataset.view, v.dataset.ready, v.dataset.renderedMs];"
                )
                if state[0] == view and state[1] == "1":
                    times.append(float(state[2]))
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{view} did not render in 30 s")
                time.sleep(0.01)
        out[view] = round(statistics.median(times), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="2 repetitions instead of --reps")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each measurement (median reported)")
    args = parser.parse_args()
    reps = 2 if args.quick else args.reps
    logging.basicConfig(level=logging.WARNING)
    driver, why = browser()
    summary: dict[str, Any] = {"browser": why or "chromium (headless)", "nodes": NODES, "gpus": NODES * GPUS}
    try:
        with EmbeddedNats() as nats:
            for pods in SIZES:
                aggregator = Aggregator(MetricsSettings().retention())
                uid = seed(aggregator, pods)
                with Served(nats.url, aggregator) as served:
                    result: dict[str, Any] = {"api_ms": api_times(served.url, uid, reps)}
                    result["page_ms"] = page_times(driver, served.url, reps) if driver is not None else None
                print(f"{pods} pods on {NODES} nodes: API {result['api_ms']} ms; page load {result['page_ms']} ms")
                summary[f"pods_{pods}"] = result
    finally:
        if driver is not None:
            driver.quit()
    sys.stdout.flush()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
