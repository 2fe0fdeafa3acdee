"""A headless Chromium for the console's page, shared by its tests and ``bench/console.py``.

Debian's ``chromium`` driven by Debian's ``chromedriver`` through Selenium (``tools/test-deps.sh`` installs
both; nothing is downloaded: both paths are given, so Selenium Manager is never asked). The flags keep the
browser off the network, which this machine does not have (without them it floods refused connections), and
let it run as root; every browser gets an empty profile of its own.
"""

from __future__ import annotations

import base64
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--disable-dev-shm-usage",
)


def missing() -> list[str]:
    """The programs this needs that are not installed (``tools/test-deps.sh`` installs them)."""
    return [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]


@contextmanager
def chromium(width: int = 1400, height: int = 1600) -> Iterator[Any]:
    """A Selenium ``webdriver.Chrome`` on a headless Chromium whose console messages ``get_log("browser")``
    returns."""
    absent = missing()
    if absent:
        raise RuntimeError(
            f"missing {', '.join(absent)}: run tools/test-deps.sh (Debian: chromium, chromium-driver)"
        )
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager: never fetch a driver or a browser
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="sidecar-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        try:
            yield driver
        finally:
            driver.quit()


def console_errors(driver: Any) -> list[str]:
    """The page's console messages of level SEVERE since the last call: errors, uncaught exceptions, refused
    resources and content-security-policy violations."""
    return [f"{e['level']}: {e['message']}" for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def screenshot(driver: Any, path: str) -> None:
    """The whole page as a PNG at ``path``, not only what the window shows (Chromium's DevTools protocol)."""
    driver.execute_script("window.scrollTo(0, 0)")
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    with open(path, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
