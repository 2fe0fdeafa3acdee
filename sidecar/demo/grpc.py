"""The gRPC part of ``sidecar demo``: a generic gRPC proxy driven by a pasted gRPC service config.

* Three replicas serve both services. ``demo.Orders/*``:  10 % of calls fail ``UNAVAILABLE`` (some with
  ``grpc-retry-pushback-ms: 20``) and 2 % ``RESOURCE_EXHAUSTED``; from second 4 to 7 an outage fails 70 %,
  and A6 retry throttling (``retryThrottling``) stops the retry storm.
* ``demo.Catalog/Get`` is hedged (``hedgingPolicy``, 15 ms): 3 % of answers are 60x slower.
* A fifth of the calls carry a 40 ms deadline (``grpc-timeout``): a slow answer ends in DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import grpc

from ..app import App
from ..config import load_dict
from ..telemetry.exposition import Registry
from ..testing.grpc_upstream import GrpcUpstream, Step, fail
from .runner import Send

OUTAGE = (4.0, 7.0)
SERVICE_CONFIG = {
    "methodConfig": [
        {
            "name": [{"service": "demo.Orders"}],
            "retryPolicy": {
                "maxAttempts": 4,
                "initialBackoff": "0.01s",
                "maxBackoff": "0.2s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        },
        {
            "name": [{"service": "demo.Catalog", "method": "Get"}],
            "hedgingPolicy": {
                "maxAttempts": 3,
                "hedgingDelay": "0.015s",
                "nonFatalStatusCodes": ["UNAVAILABLE"],
            },
        },
    ],
    "retryThrottling": {"maxTokens": 20, "tokenRatio": 0.2},
}


class _Replica:
    """One replica's behaviour: orders fail at random (more during the outage), the catalog has a slow tail."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.fail_rate = 0.12

    def __call__(self, method: str) -> Step:
        r = self.rng.random()
        if method.startswith("/demo.Catalog/"):
            return Step(delay=0.003 * (60 if r < 0.03 else 1))
        if r < self.fail_rate * 0.6:
            return fail(grpc.StatusCode.UNAVAILABLE, delay=0.001)
        if r < self.fail_rate * 0.85:
            return fail(grpc.StatusCode.UNAVAILABLE, pushback="20", delay=0.001)
        if r < self.fail_rate:
            return fail(grpc.StatusCode.RESOURCE_EXHAUSTED, delay=0.001)
        return Step(delay=0.002)


class GrpcPart:
    name = "grpc"
    title = "orders with retries and an outage at 4-7 s (A6 throttling), hedged catalog, 40 ms deadlines"

    @asynccontextmanager
    async def session(self, admin: str | None = None) -> AsyncIterator[tuple[Send, Registry]]:
        async with AsyncExitStack() as stack:
            replicas = [_Replica(seed) for seed in (3, 4, 5)]
            upstreams = [
                await stack.enter_async_context(GrpcUpstream(r, keep_records=False)) for r in replicas
            ]
            app = await stack.enter_async_context(App(load_dict(_config(upstreams, admin), {})))
            host, port = app.address("demo-grpc")
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(f"{host}:{port}"))
            get_order = channel.unary_unary("/demo.Orders/Get")
            get_item = channel.unary_unary("/demo.Catalog/Get")
            rng = random.Random(11)
            outage = asyncio.create_task(_outage(replicas))
            stack.callback(outage.cancel)

            async def send() -> bool:
                call = get_order if rng.random() < 0.5 else get_item
                timeout = 0.04 if rng.random() < 0.2 else 10.0
                try:
                    await call(b"demo", timeout=timeout)
                except grpc.aio.AioRpcError:
                    return False
                return True

            yield send, app.telemetry.metrics.registry


async def _outage(replicas: list[_Replica]) -> None:
    await asyncio.sleep(OUTAGE[0])
    for r in replicas:
        r.fail_rate = 0.7
    await asyncio.sleep(OUTAGE[1] - OUTAGE[0])
    for r in replicas:
        r.fail_rate = 0.12


def _config(upstreams: list[GrpcUpstream], admin: str | None = None) -> dict:
    return {
        "admin": {"listen": admin},
        "upstreams": {"backend": {"endpoints": [u.endpoint for u in upstreams]}},
        "listeners": [
            {
                "name": "demo-grpc",
                "protocol": "grpc",
                "listen": "127.0.0.1:0",
                "upstream": "backend",
                "service_config": SERVICE_CONFIG,
                "unary_requests": ["demo.Orders", "demo.Catalog"],  # their methods are unary: the cheaper form
            }
        ],
    }


PART = GrpcPart()
