"""The MongoDB part of ``sidecar demo``: two mongos routers that shed load with their ingress rate limiter.

Each router admits 200 commands/s (MongoDB 8.2's ``ingressRequestRateLimiter``; a rejected command gets code
462 with ``SystemOverloadedError`` + ``RetryableError``). The app (pymongo's async client, its own retries
off) sends a mix of ``find_one`` and ``insert_one``. From second 4 to 7 router A's limit drops to 30/s, as
Mongotune would do on an overloaded router: the sidecar backs off, moves retries to router B and keeps the
retries inside its token bucket. A tenth of the finds carry ``maxTimeMS: 50``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pymongo

from ..app import App
from ..config import load_dict
from ..telemetry.exposition import Registry
from ..testing.mongo import MongoTestServer
from .runner import Send

RATE = 200.0
SQUEEZE = (4.0, 7.0, 30.0)  # from, to, router A's rate meanwhile


class MongoPart:
    name = "mongodb"
    title = "two routers shedding load (router A squeezed to 30/s at 4-7 s): backoff, retargeting, bucket"

    @asynccontextmanager
    async def session(self, admin: str | None = None) -> AsyncIterator[tuple[Send, Registry]]:
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(MongoTestServer("mongos", record=False))
            b = await stack.enter_async_context(MongoTestServer("mongos", storage=a.storage, record=False))
            a.storage.collection("shop", "orders").insert({"_id": 1, "item": "widget", "qty": 7})
            for r in (a, b):
                r.limit_rate(RATE)
            cfg = {
                "admin": {"listen": admin},
                "upstreams": {"routers": {"endpoints": [a.endpoint, b.endpoint]}},
                "listeners": [
                    {"name": "demo", "protocol": "mongodb", "listen": "127.0.0.1:0", "upstream": "routers"}
                ],
            }
            app = await stack.enter_async_context(App(load_dict(cfg, {})))
            host, port = app.address("demo")
            client = pymongo.AsyncMongoClient(
                f"mongodb://{host}:{port}/?retryReads=false&retryWrites=false&maxAdaptiveRetries=0",
                maxPoolSize=200,
            )
            stack.push_async_callback(client.close)
            orders = client.shop.orders
            rng = random.Random(13)
            squeeze = asyncio.create_task(_squeeze(a))
            stack.callback(squeeze.cancel)

            async def send() -> bool:
                try:
                    if rng.random() < 0.3:
                        await orders.insert_one({"item": "gadget", "qty": rng.randint(1, 9)})
                    elif rng.random() < 0.1:
                        await orders.find_one({"_id": 1}, max_time_ms=50)
                    else:
                        await orders.find_one({"_id": 1})
                except pymongo.errors.PyMongoError:
                    return False
                return True

            yield send, app.telemetry.metrics.registry


async def _squeeze(router: MongoTestServer) -> None:
    start, end, rate = SQUEEZE
    await asyncio.sleep(start)
    router.limit_rate(rate)
    await asyncio.sleep(end - start)
    router.limit_rate(RATE)


PART = MongoPart()
