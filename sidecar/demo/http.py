"""The HTTP part of ``sidecar demo``: a flaky upstream with an outage, a pair with a slow tail, deadlines.

* ``/orders`` goes to ``orders``: 10 % of answers are 502, 503 (some with ``Retry-After: 0``) or 429 with
  ``x-retry-after-ms``, 5 % are 30x slower; from second 4 to 7 an outage fails 70 %, and the retry budget
  stops the retry storm.
* ``/catalog`` goes to ``catalog``, two replicas where 3 % of answers are 60x slower: hedged after 15 ms.
* A fifth of the requests carry ``X-YaTaxi-Client-TimeoutMs: 40`` (a slow answer expires: 498 at once).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import aiohttp

from ..app import App
from ..config import load_dict
from ..telemetry.exposition import Registry
from ..testing.http_upstream import Fault, FaultyUpstream
from .runner import Send

FLAKY = (
    Fault(502, body=b"bad gateway"),
    Fault(503, body=b"busy"),
    Fault(503, retry_after="0", body=b"busy"),
    Fault(429, headers=(("x-retry-after-ms", "20"),), body=b"slow down"),
)
OUTAGE = (4.0, 7.0)


class HttpPart:
    name = "http"
    title = "flaky orders (with an outage at 4-7 s), catalog with a slow tail (hedged), deadlines"

    @asynccontextmanager
    async def session(self, admin: str | None = None) -> AsyncIterator[tuple[Send, Registry]]:
        async with AsyncExitStack() as stack:
            orders = await stack.enter_async_context(
                FaultyUpstream(
                    latency=0.002,
                    slow_fraction=0.05,
                    slow_factor=30,
                    fail_rate=0.1,
                    fail=FLAKY,
                    keep_records=False,
                    seed=3,
                )
            )
            catalog = [
                await stack.enter_async_context(
                    FaultyUpstream(
                        latency=0.003, slow_fraction=0.03, slow_factor=60, keep_records=False, seed=s
                    )
                )
                for s in (4, 5)
            ]
            app = await stack.enter_async_context(App(load_dict(_config(orders, catalog, admin), {})))
            http = await stack.enter_async_context(
                aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=200), timeout=aiohttp.ClientTimeout(total=10)
                )
            )
            host, port = app.address("demo")
            base = f"http://{host}:{port}"
            rng = random.Random(11)
            outage = asyncio.create_task(_outage(orders))
            stack.callback(outage.cancel)

            async def send() -> bool:
                path = "/orders/42" if rng.random() < 0.5 else "/catalog/7"
                headers = {"X-YaTaxi-Client-TimeoutMs": "40"} if rng.random() < 0.2 else {}
                async with http.get(base + path, headers=headers) as r:
                    await r.read()
                    return r.status == 200

            yield send, app.telemetry.metrics.registry


async def _outage(orders: FaultyUpstream) -> None:
    start, end = OUTAGE
    await asyncio.sleep(start)
    orders.fail_rate = 0.7
    await asyncio.sleep(end - start)
    orders.fail_rate = 0.1


def _config(orders: FaultyUpstream, catalog: list[FaultyUpstream], admin: str | None = None) -> dict:
    return {
        "admin": {"listen": admin},
        "upstreams": {
            "orders": {"endpoints": [orders.endpoint]},
            "catalog": {"endpoints": [c.endpoint for c in catalog]},
        },
        "policies": {
            "orders": {
                "extends": "http-default",
                "backoff": {"initial": "10ms", "max": "100ms"},
                "pushback_header": "x-retry-after-ms",
                "throttle": {"kind": "grpc", "max_tokens": 10, "token_ratio": 0.5},
                "deadline": {"default": "2s"},
            },
            "catalog": {
                "extends": "http-default",
                "per_try_timeout": "1s",
                "hedging": {"max_attempts": 2, "delay": "15ms"},
            },
        },
        "listeners": [
            {
                "name": "demo",
                "protocol": "http",
                "listen": "127.0.0.1:0",
                "upstream": "orders",
                "policy": "orders",
                "routes": [
                    {"match": {"path_prefix": "/catalog"}, "upstream": "catalog", "policy": "catalog"}
                ],
            }
        ],
    }


PART = HttpPart()
