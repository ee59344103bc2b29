"""Headless Chromium for the web page's tests: Debian's ``chromium`` driven by its ``chromedriver`` (Selenium).

Without them every test here skips with the reason (``make test`` installs them as root); under ``CI=true``
that is a failure, so CI never passes without having driven a real browser. Selenium Manager never runs:
both paths are given, so Selenium has nothing to look up or download, and Chromium starts with the flags
that keep it off the network (a fresh profile, no background fetches, no component updates).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final, TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM: Final = Path("/usr/bin/chromium")
CHROMEDRIVER: Final = Path("/usr/bin/chromedriver")
FLAGS: Final = (
    "--headless=new",
    "--no-sandbox",  # tests run as root in a container
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
)
T = TypeVar("T")


def chromium_or_skip() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if not missing:
        return
    reason = (
        f"{' and '.join(missing)} not found (Debian's chromium and chromium-driver; make test installs them as root)"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(f"the browser tests must run under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def start_chromium(profile: str) -> WebDriver:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    return webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))


@pytest.fixture(scope="session")
def chromium() -> Iterator[WebDriver]:
    """One browser for the session (starting Chromium costs seconds on two cores)."""
    chromium_or_skip()
    with tempfile.TemporaryDirectory(prefix="hami-chromium-") as profile:
        try:
            driver = start_chromium(profile)
        except WebDriverException as err:
            if os.environ.get("CI") == "true":
                raise
            pytest.skip(f"chromium did not start: {err.msg}")
        try:
            yield driver
        finally:
            driver.quit()


class Browser:
    """The driver, called from a worker thread: the stack under test serves on this test's event loop, which
    must stay free to answer the page's requests while Selenium waits for them."""

    def __init__(self, driver: WebDriver, base: str) -> None:
        self.driver = driver
        self.base = base

    async def call(self, fn: Callable[[], T]) -> T:
        return await asyncio.to_thread(fn)

    async def script(self, source: str, *args: object) -> object:
        return await self.call(lambda: self.driver.execute_script(source, *args))

    async def rendered(self, view: str, timeout_s: float = 20.0) -> None:
        """Wait until the page shows ``view`` (its script sets data-ready once the view is drawn)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            state = await self.script(
                "const v = document.getElementById('view'); return v && [v.dataset.view, v.dataset.ready];"
            )
            if state == [view, "1"]:
                return
            if loop.time() > deadline:
                raise AssertionError(f"the page did not render {view!r} within {timeout_s}s (it shows {state})")
            await asyncio.sleep(0.05)

    async def open(self, route: str, view: str) -> None:
        """Load the page afresh at ``#/route`` (auto-refresh off, so nothing redraws under the test)."""
        await self.call(lambda: self.driver.get(f"{self.base}?refresh=0#/{route}"))
        await self.rendered(view)

    async def follow(self, selector: str, view: str) -> None:
        """Click the first link matching ``selector`` and wait for the view it leads to."""
        await self.script("document.getElementById('view').dataset.ready = '0'")
        found = await self.script(
            "const a = document.querySelector(arguments[0]); if (a) a.click(); return !!a;", selector
        )
        assert found, f"no link {selector} on the page"
        await self.rendered(view)

    async def values(self, row_selector: str, key: str) -> dict[str, dict[str, str]]:
        """{row's data-<key>: {field: its data-value}} of every row matching ``row_selector``."""
        found = await self.script(
            """const out = {};
            for (const row of document.querySelectorAll(arguments[0])) {
              const cells = {};
              for (const c of row.querySelectorAll('[data-field]')) {
                cells[c.dataset.field] = c.dataset.value ?? c.textContent;
              }
              out[row.dataset[arguments[1]]] = cells;
            }
            return out;""",
            row_selector,
            key,
        )
        assert isinstance(found, dict)
        return found

    async def text(self, selector: str = "#view") -> str:
        found = await self.script(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", selector
        )
        return str(found)

    async def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        await self.call(lambda: self.driver.save_screenshot(str(path)))
