"""Real aiohttp clients -> the sidecar (in-process) -> real fault-injecting upstreams on 127.0.0.1:0."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from sidecar.app import App
from sidecar.config import load_dict
from sidecar.policy import Reason
from sidecar.testing.http_upstream import FaultyUpstream
from tests.metrics import metric

#: No backoff waits: tests assert order and counts, not durations.
FAST = {"backoff": {"initial": "0ms", "max": "0ms", "jitter": "none"}}


def config(
    endpoints: list[str],
    policy: dict[str, Any] | None = None,
    *,
    listener: dict[str, Any] | None = None,
    upstreams: dict[str, list[str]] | None = None,
    policies: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A sidecar with one HTTP listener ``web`` in front of upstream ``api`` (``endpoints``) under policy
    ``p`` (``http-default`` with no backoff, plus ``policy``)."""
    ups = {"api": {"endpoints": endpoints}}
    for name, eps in (upstreams or {}).items():
        ups[name] = {"endpoints": eps}
    pols = {"p": {"extends": "http-default", **FAST, **(policy or {})}}
    pols.update(policies or {})
    lst = {"name": "web", "protocol": "http", "listen": "127.0.0.1:0", "upstream": "api", "policy": "p"}
    lst.update(listener or {})
    return {"admin": {"listen": None}, "upstreams": ups, "policies": pols, "listeners": [lst]}


class Sidecar:
    def __init__(self, app: App) -> None:
        self.app = app
        host, port = app.address("web")
        self.host, self.port = host, port
        self.url = f"http://{host}:{port}"

    def metric(self, name: str, **labels: str) -> float:
        return metric(self.app, name, **labels)

    def requests(self, reason: Reason) -> float:
        return self.metric("sidecar_requests_total", reason=reason.value)


@asynccontextmanager
async def sidecar(
    cfg: dict[str, Any], rand: Callable[[], float] = lambda: 0.0, **kw: Any
) -> AsyncIterator[Sidecar]:
    async with App(load_dict(cfg, {}), rand=rand, **kw) as app:
        yield Sidecar(app)


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
        yield s


@pytest.fixture
async def upstream() -> AsyncIterator[FaultyUpstream]:
    async with FaultyUpstream() as up:
        yield up


@pytest.fixture
async def upstream2() -> AsyncIterator[FaultyUpstream]:
    async with FaultyUpstream(seed=2) as up:
        yield up


async def raw(host: str, port: int, data: bytes, *, until_close: bool = True, read: int = 65536) -> bytes:
    """Send raw bytes on a fresh connection; read the answer (until the sidecar closes, or one read)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        if not until_close:
            return await reader.read(read)
        return await reader.read(-1)
    finally:
        writer.close()


def unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
