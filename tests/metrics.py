"""Reading a running sidecar's Prometheus counters in tests (the registry the admin port serves), and waiting
for one to reach a value."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sidecar.app import App


def metric(app: App, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for family in app.telemetry.metrics.registry.collect():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def until(check: Callable[[], bool], what: str, bound: float = 20.0) -> None:
    """Poll ``check`` until it holds, for up to ``bound`` seconds (a generous bound: a loaded machine must not
    fail it). For what has no event to wait on: gauges read at scrape time, the pools' in-use counts."""
    loop = asyncio.get_running_loop()
    end = loop.time() + bound
    while not check():
        assert loop.time() < end, f"still not: {what}"
        await asyncio.sleep(0.005)
