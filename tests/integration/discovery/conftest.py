"""Upstreams by name (issue 21): real clients -> the sidecar (in-process) -> real upstreams on 127.0.0.2, .3,
.4 (all of 127/8 is loopback), the names answered by a real DNS server (dnsmasq, ``sidecar/testing/
dns_server.py``) whose answers the tests change."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import aiohttp
import pytest

from sidecar.app import App
from sidecar.config import load_dict
from sidecar.testing.dns_server import DnsServer
from tests.metrics import metric

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
#: Fast enough for tests: a stopped DNS server costs a resolution 300 ms, a change is seen within 300 ms.
RESOLVER_TIMEOUT = "300ms"
DNS = {"refresh": "200ms", "jitter": "100ms"}

U = TypeVar("U")


@pytest.fixture
async def dns() -> AsyncIterator[DnsServer]:
    async with DnsServer(ttl=1) as server:
        yield server


async def on_one_port(make: Callable[[str, int], Awaitable[U]], hosts: Sequence[str] = HOSTS) -> list[U]:
    """Start one server per host, all on one port (a name's addresses share the port it is written with):
    ``make(host, port)`` starts one (port 0 for the first: any free one)."""
    for _ in range(20):
        port = _free_on(hosts)
        try:
            return [await make(host, port) for host in hosts]
        except OSError:  # taken meanwhile by someone else: another port
            continue
    raise RuntimeError(f"no port free on all of {hosts}")


def _free_on(hosts: Sequence[str]) -> int:
    while True:
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = int(s.getsockname()[1])
        try:
            for h in hosts[1:]:
                with socket.socket() as s:
                    s.bind((h, port))
        except OSError:
            continue
        return port


def sidecar_config(
    dns: DnsServer,
    endpoints: list[str],
    *,
    protocol: str = "http",
    upstream: dict[str, Any] | None = None,
    policy: dict[str, Any] | None = None,
    admin: bool = True,
) -> dict[str, Any]:
    """One listener ``l`` in front of upstream ``u`` (``endpoints``), names resolved by ``dns``."""
    preset = "http-default" if protocol == "http" else "grpc-a6"
    backoff = {"initial": "1ms", "max": "1ms", "jitter": "none"}
    return {
        "admin": {"listen": "127.0.0.1:0" if admin else None},
        "resolver": {"nameservers": [dns.address], "timeout": RESOLVER_TIMEOUT},
        "upstreams": {"u": {"endpoints": endpoints, "dns": dict(DNS), **(upstream or {})}},
        "policies": {"p": {"extends": preset, "backoff": backoff, **(policy or {})}},
        "listeners": [
            {"name": "l", "protocol": protocol, "listen": "127.0.0.1:0", "upstream": "u", "policy": "p"}
        ],
    }


@asynccontextmanager
async def running(cfg: dict[str, Any], seed: int = 1, **kw: Any) -> AsyncIterator[App]:
    async with App(load_dict(cfg, {}), rand=random.Random(seed).random, **kw) as app:
        yield app


def url(app: App, path: str = "/x") -> str:
    host, port = app.address("l")
    return f"http://{host}:{port}{path}"


def admin(app: App) -> str:
    assert app.admin is not None
    host, port = app.admin.address
    return f"http://{host}:{port}"


def addresses(app: App, upstream: str = "u") -> list[str]:
    """The upstream's set now (its balancer's endpoints)."""
    return list(app.services.upstream(upstream).balancer.endpoints)


def resolutions(app: App, result: str) -> float:
    return metric(app, "sidecar_dns_resolutions_total", upstream="u", result=result)


async def get_many(http: aiohttp.ClientSession, target: str, n: int, at_once: int) -> list[tuple[int, str]]:
    """``n`` GETs, ``at_once`` at a time: each one's status and body."""
    sem = asyncio.Semaphore(at_once)

    async def one() -> tuple[int, str]:
        async with sem, http.get(target) as r:
            return r.status, await r.text()

    return list(await asyncio.gather(*(one() for _ in range(n))))


def connections_to(address: str) -> int:
    """TCP connections this process holds open to ``address`` (``127.0.0.2:8080``), read from the kernel's
    tables: what a channel or pool really keeps, whatever its library says (grpc's connections are IPv6
    sockets to the IPv4-mapped address: /proc/net/tcp6)."""
    host, _, port = address.rpartition(":")
    v4 = socket.inet_aton(host)[::-1].hex().upper()
    wanted = {f"{v4}:{int(port):04X}", f"0000000000000000FFFF0000{v4}:{int(port):04X}"}
    established = "01"
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[2] in wanted and fields[3] == established:
                    n += 1
    return n
