"""The console's test scene: a sidecar (in this process) in front of three real upstreams on 127.0.0.1, one of
which is overloaded (it answers every request 503), real aiohttp clients sending requests that retry, and the
admin port's JSON and Prometheus text read over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sidecar.app import App
from sidecar.config import load_dict
from sidecar.testing.http_upstream import Fault, FaultyUpstream

T = TypeVar("T")
#: A query string on every request: it must never show in the tap.
SECRET = "s3cr3t-query-token-value"
ARTIFACTS = Path(__file__).resolve().parents[3] / "build" / "test-artifacts" / "console"


def config(endpoints: list[str], **admin: Any) -> dict[str, Any]:
    return {
        "admin": {"listen": "127.0.0.1:0", **admin},
        "upstreams": {
            "orders": {
                "endpoints": endpoints,
                "overload_cooldown": "500ms",  # the overloaded endpoint is tried (and retried away from) twice a second
                # the overloaded endpoint stays "cooldown" (overloaded), never ejected: what the page must show
                "outlier_detection": {"enabled": False},
                "concurrency": {"mode": "probing", "initial": 16, "min": 4, "max": 64},
                "retry_budget": {"ratio": 0.5, "min_per_second": 50},
            }
        },
        "policies": {"p": {"extends": "http-default", "backoff": {"initial": "1ms", "max": "5ms"}}},
        "listeners": [
            {"name": "web", "protocol": "http", "listen": "127.0.0.1:0", "upstream": "orders", "policy": "p"}
        ],
    }


@dataclass
class Scene:
    app: App
    hot: FaultyUpstream  # answers every request 503 (overloaded)
    good: list[FaultyUpstream]
    http: aiohttp.ClientSession
    admin: str = ""  # http://host:port
    sent: int = 0
    load: list[asyncio.Task[None]] = field(default_factory=list)
    loading: bool = False

    @property
    def admin_hostport(self) -> str:
        return self.admin.removeprefix("http://")

    async def get(self, path: str, **params: Any) -> Any:
        async with self.http.get(self.admin + path, params=params) as r:
            assert r.status == 200, (r.status, await r.text())
            return await r.json()

    async def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """``/metrics`` as served: each sample name's (labels, value) rows."""
        async with self.http.get(self.admin + "/metrics") as r:
            text = await r.text()
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out

    async def request(self, i: int) -> int:
        host, port = self.app.address("web")
        async with self.http.get(f"http://{host}:{port}/orders/{i}", params={"token": SECRET}) as r:
            await r.read()
            self.sent += 1
            return r.status

    def start_load(self, clients: int = 3, pause: float = 0.01) -> None:
        """Clients sending one request after another (``pause`` seconds apart) until ``stop_load``."""
        self.loading = True

        async def client(k: int) -> None:
            i = k
            while self.loading:
                await self.request(i)
                i += clients
                await asyncio.sleep(pause)

        self.load = [asyncio.create_task(client(k)) for k in range(clients)]

    async def stop_load(self) -> None:
        """Each client finishes the request it is sending, then stops (none is cut off half-way)."""
        self.loading = False
        await asyncio.gather(*self.load)
        self.load = []


async def eventually(
    fetch: Callable[[], Awaitable[T]], holds: Callable[[T], bool], what: str, bound: float = 20.0
) -> T:
    """``fetch()`` again and again (every 50 ms) until ``holds`` of what it gave, for up to ``bound`` seconds (a
    generous bound: a loaded machine must not fail it); that value."""
    loop = asyncio.get_running_loop()
    end = loop.time() + bound
    while True:
        value = await fetch()
        if holds(value):
            return value
        assert loop.time() < end, f"still not: {what} (last: {value!r:.2000})"
        await asyncio.sleep(0.05)


def sum_of(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for lb, v in metrics.get(name, []) if all(lb.get(k) == x for k, x in labels.items()))


@asynccontextmanager
async def scene(**admin: Any) -> AsyncIterator[Scene]:
    async with AsyncExitStack() as stack:
        good = [
            await stack.enter_async_context(FaultyUpstream(latency=0.001, keep_records=False, seed=s))
            for s in (1, 2)
        ]
        hot = await stack.enter_async_context(
            FaultyUpstream(fail_rate=1.0, fail=Fault(503, body=b"busy"), keep_records=False)
        )
        app = await stack.enter_async_context(
            App(load_dict(config([good[0].endpoint, hot.endpoint, good[1].endpoint], **admin), {}))
        )
        http = await stack.enter_async_context(aiohttp.ClientSession())
        assert app.admin is not None
        host, port = app.admin.address
        s = Scene(app, hot, good, http, f"http://{host}:{port}")
        try:
            yield s
        finally:
            await s.stop_load()
