"""The console's page in a real headless Chromium (Debian's, driven by Selenium through Debian's chromedriver),
while real clients retry through the sidecar and one of its endpoints is overloaded: the page shows that
endpoint overloaded and the retries within 2 s of loading, its totals are /metrics' numbers, its charts
advance, its tap lists the requests with their decisions, and the browser reports no error. A screenshot is
written to build/test-artifacts/console/console.png."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sidecar.testing.browser import chromium, console_errors, missing, screenshot

from .scenario import ARTIFACTS, SECRET, eventually, scene, sum_of


def js(driver: Any, script: str) -> Any:
    return driver.execute_script(script)


def wait(driver: Any, script: str, seconds: float, what: str) -> Any:
    """Until ``script`` (a JavaScript expression) is truthy in the page, for up to ``seconds``."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, seconds, poll_frequency=0.05).until(
            lambda d: d.execute_script("return " + script)
        )
    except TimeoutException:
        raise AssertionError(f"the page did not show {what} within {seconds} s") from None


def cell(pair: str, table: str, field: str) -> str:
    return f'document.querySelector(\'#{table} tr[data-pair="{pair}"] td[data-field="{field}"]\')'


@pytest.fixture(scope="module", autouse=True)
def browser_installed() -> None:
    absent = missing()
    if absent:  # loud: a browser test that cannot run is a failure, never a skip
        pytest.fail(
            f"CHROMIUM IS NOT INSTALLED ({', '.join(absent)}): run tools/test-deps.sh (make test does)"
        )


async def test_the_page_shows_an_overloaded_endpoint_retries_its_tap_and_the_numbers_of_metrics() -> None:
    async with scene() as s:
        await s.get("/api/tap", limit=0)
        s.start_load()
        # the sidecar has something to show first: the page's own time is what is measured below
        await eventually(
            lambda: s.get("/api/state"),
            lambda st: (
                any(e["state"] == "cooldown" for e in st["upstreams"][0]["endpoints"])
                and (st["traffic"][0]["last"] or {}).get("retries", 0) > 0
            ),
            "cooldown and retries in /api/state",
        )
        with chromium(1280, 1240) as driver:
            pair = "web → orders"
            hot = s.hot.endpoint

            shows = (
                f'document.querySelector(\'tr[data-endpoint="{hot}"][data-state="cooldown"]\')'
                f" && parseFloat({cell(pair, 'traffic', 'retries')}.dataset.value) > 0"
            )
            # The page's own clock says when it first showed both (WebDriver's round trips, slow on a loaded
            # machine, are not the page's time): a watcher installed before the page's scripts run, which also
            # keeps the endpoint's row as it was then.
            row_js = f"document.querySelector('tr[data-endpoint=\"{hot}\"]').innerText"
            watcher = (
                "window.__shownAt = null; new MutationObserver(() => { if (window.__shownAt === null && ("
                + shows
                + ")) { window.__shownAt = performance.now(); window.__shownRow = "
                + row_js
                + "; } }).observe(document, {subtree: true, childList: true, attributes: true});"
            )

            def load_and_look() -> tuple[float, float, str]:
                driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": watcher})
                driver.get(s.admin + "/")
                wait(
                    driver,
                    "window.__shownAt !== null",
                    30,
                    "the overloaded endpoint in cooldown and retries/s",
                )
                html = js(driver, "return performance.getEntriesByType('navigation')[0].responseEnd")
                shown = js(driver, "return window.__shownAt")
                return shown / 1000, html / 1000, js(driver, "return window.__shownRow")

            shown_after, html, row = await asyncio.to_thread(load_and_look)
            # seconds since the page was opened (and, for a slow machine's record, since its HTML arrived)
            assert shown_after <= 2.0, (
                f"shown after {shown_after:.2f} s (the HTML had arrived after {html:.2f} s)"
            )
            assert "cooldown (overloaded)" in row

            # the charts advance: a new point a second
            def chart_advances() -> tuple[float, float]:
                first = float(
                    wait(driver, "document.getElementById('chart-success').dataset.lastT", 5, "a chart")
                )
                wait(
                    driver,
                    f"parseFloat(document.getElementById('chart-success').dataset.lastT) > {first}"
                    " && document.querySelector('#chart-success canvas')",
                    5,
                    "the chart's next point",
                )
                last = float(js(driver, "return document.getElementById('chart-success').dataset.lastT"))
                return first, last

            first, last = await asyncio.to_thread(chart_advances)
            assert 0.5 < last - first < 5

            # the tap: requests with their attempts and decisions, never a query string
            def tap() -> tuple[str, str]:
                wait(
                    driver,
                    "document.querySelector('#tap tr[data-reason=\"success\"]')",
                    5,
                    "a tapped request",
                )
                retried = wait(
                    driver,
                    "[...document.querySelectorAll('#tap tbody tr')].map(r => r.innerText)"
                    ".find(t => t.includes('→ retry'))",
                    10,
                    "a retried request in the tap",
                )
                return retried, js(driver, "return document.getElementById('tap').innerText")

            retried, text = await asyncio.to_thread(tap)
            assert (
                "GET /orders/" in retried
                and f"{hot} overloaded 503" in retried
                and "success (200)" in retried
            )
            assert "token" not in text and SECRET not in await asyncio.to_thread(lambda: driver.page_source)

            def notable() -> list[str]:
                driver.find_element("id", "tap-notable").click()  # only the retried or failed ones
                return js(
                    driver, "return [...document.querySelectorAll('#tap tbody tr')].map(r => r.innerText)"
                )

            rows = await asyncio.to_thread(notable)
            assert rows and all("→ retry" in r or "hedge" in r or "success (200)" not in r for r in rows), (
                rows
            )
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(screenshot, driver, str(ARTIFACTS / "console.png"))  # the scene at work

            # the totals are the numbers /metrics exports
            await s.stop_load()
            sent = s.sent
            await asyncio.to_thread(
                wait,
                driver,
                f"{cell(pair, 'totals', 'requests')}.dataset.value == '{sent}'",
                10,
                f"{sent} requests",
            )
            m = await s.metrics()
            lu = {"listener": "web", "upstream": "orders"}
            page = await asyncio.to_thread(
                js,
                driver,
                "return Object.fromEntries([...document.querySelectorAll('#totals tr[data-pair] td[data-field]')]"
                ".map(td => [td.dataset.field, td.dataset.value]))",
            )
            assert int(page["requests"]) == sum_of(m, "sidecar_requests_total", **lu) == sent
            assert int(page["retries"]) == sum_of(m, "sidecar_retries_total", **lu) > 0
            assert int(page["attempts"]) == sum_of(m, "sidecar_attempts_total", **lu) > sent
            assert int(page["hedges"]) == sum_of(m, "sidecar_hedges_total", **lu)
            assert (await asyncio.to_thread(console_errors, driver)) == []


async def test_the_page_says_so_when_the_sidecar_goes_away_and_no_script_error_follows() -> None:
    async with scene() as s:
        with chromium(1000, 800) as driver:
            await asyncio.to_thread(driver.get, s.admin + "/")
            await asyncio.to_thread(wait, driver, "window.sidecarConsole.polls > 0", 10, "a first poll")
            await s.app.stop(0)
            await asyncio.to_thread(
                wait,
                driver,
                "!document.getElementById('banner').hidden",
                5,
                "the banner about the lost sidecar",
            )
            banner = await asyncio.to_thread(js, driver, "return document.getElementById('banner').innerText")
            assert "Cannot reach the sidecar" in banner
            errors = await asyncio.to_thread(console_errors, driver)
            # the failed fetches themselves are reported by Chromium; nothing else may be
            assert all("Failed to load resource" in e or "ERR_CONNECTION_REFUSED" in e for e in errors), (
                errors
            )
