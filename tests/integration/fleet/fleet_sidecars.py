"""Sidecars of one fleet as in-process Apps (each its own listener, budget and settle task), and a client that
drives them."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp

from sidecar.app import App
from sidecar.config import load_dict
from sidecar.fleet.link import FleetLink

_prefixes = itertools.count()


def new_prefix() -> str:
    """Sidecars sharing a prefix share budgets: each test gets its own fleet."""
    return f"test-fleet-{time.time_ns()}-{next(_prefixes)}:"


def fleet_config(
    endpoint: str,
    redis_url: str,
    prefix: str,
    *,
    scope: str = "fleet",
    ratio: float = 0.2,
    min_per_second: float = 10,
    lease: str = "100ms",
    timeout: str = "100ms",
    fallback_members: int = 1,
    max_attempts: int = 3,
) -> dict[str, Any]:
    """One HTTP listener ``web`` -> upstream ``api`` with a retry budget; the policy has no throttle of its
    own and no backoff, so that the budget alone decides and tests run fast."""
    return {
        "admin": {"listen": None},
        "fleet": {
            "redis": {"url": redis_url, "timeout": timeout, "key_prefix": prefix},
            "lease": lease,
            "fallback_members": fallback_members,
        },
        "upstreams": {
            "api": {
                "endpoints": [endpoint],
                "retry_budget": {
                    "scope": scope,
                    "ratio": ratio,
                    "min_per_second": min_per_second,
                    "window": "10s",
                },
            }
        },
        "policies": {
            "p": {
                "extends": "http-default",
                "backoff": {"initial": "0ms", "max": "0ms", "jitter": "none"},
                "throttle": None,
                "max_attempts": max_attempts,
            }
        },
        "listeners": [
            {"name": "web", "protocol": "http", "listen": "127.0.0.1:0", "upstream": "api", "policy": "p"}
        ],
    }


def link(app: App) -> FleetLink:
    assert app.fleet is not None, "this sidecar has no fleet-wide budget"
    return app.fleet


def url(app: App) -> str:
    host, port = app.address("web")
    return f"http://{host}:{port}/"


@asynccontextmanager
async def fleet(cfg: dict[str, Any], n: int) -> AsyncIterator[list[App]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(App(load_dict(cfg, {}))) for _ in range(n)]


async def drive(urls: Sequence[str], n: int, concurrency: int = 6) -> list[tuple[int, float]]:
    """Send ``n`` GETs, round robin over ``urls``, ``concurrency`` at a time: ``(status, seconds)`` each."""
    results: list[tuple[int, float]] = []
    counter = itertools.count()
    loop = asyncio.get_running_loop()

    async def worker(session: aiohttp.ClientSession) -> None:
        while (i := next(counter)) < n:
            started = loop.time()
            async with session.get(urls[i % len(urls)]) as resp:
                await resp.read()
                results.append((resp.status, loop.time() - started))

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return results
