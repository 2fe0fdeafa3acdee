"""The door on an HTTP listener (issue 12), with real aiohttp clients and raw sockets against a real upstream:
a burst beyond the rate is partly answered 429 (with Retry-After and the IETF RateLimit fields) and the
upstream sees only what was admitted; exempt addresses and paths pass; queued requests go in order when their
token is due; shadow mode admits everything and counts; a connection flood is closed before any reply."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from typing import Any

import aiohttp

from sidecar.testing.http_upstream import FaultyUpstream

from ..http.conftest import config, sidecar

#: A bucket that holds 5 and refills one a second: a burst of 20 sent at once cannot all pass.
SLOW = {"rate": 1, "burst": "5s"}


def with_admission(endpoint: str, profile: dict[str, Any], **listener: Any) -> dict[str, Any]:
    cfg = config([endpoint], listener={"admission": "front", **listener})
    cfg["admission"] = {"front": profile}
    return cfg


async def get(client: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, str], bytes]:
    async with client.get(url) as r:
        return r.status, dict(r.headers), await r.read()


async def burst(client: aiohttp.ClientSession, url: str, n: int) -> list[tuple[int, dict[str, str], bytes]]:
    return await asyncio.gather(*(get(client, url) for _ in range(n)))


async def test_a_burst_beyond_the_rate_is_partly_refused_and_the_upstream_sees_only_the_admitted(
    upstream: FaultyUpstream, client: aiohttp.ClientSession
) -> None:
    async with sidecar(with_admission(upstream.endpoint, {"requests": SLOW})) as sc:
        began = time.monotonic()
        answers = await burst(client, sc.url + "/x", 20)
        elapsed = time.monotonic() - began
        ok = [a for a in answers if a[0] == 200]
        refused = [a for a in answers if a[0] == 429]
        assert len(ok) + len(refused) == 20
        # the burst (5), plus at most one token per second that passed while sending
        assert 5 <= len(ok) <= 5 + int(elapsed) + 1
        assert upstream.hits == len(ok)
        status, headers, body = refused[0]
        assert headers["Retry-After"] == "1"  # the next token is less than a second away: rounded up
        assert headers["RateLimit-Policy"] == '"front";q=5;w=5'
        assert headers["RateLimit"] == '"front";r=0;t=1'
        assert body.startswith(b"retry-sidecar: request rate limit of listener 'web' exceeded (rate-exceeded")
        labels = {"listener": "web", "limiter": "requests", "shadow": "false"}
        assert sc.metric("sidecar_admission_attempted_total", **labels) == 20
        assert sc.metric("sidecar_admission_successful_total", **labels) == len(ok)
        assert sc.metric("sidecar_admission_rejected_total", reason="rate-exceeded", **labels) == len(refused)


async def test_exempt_addresses_and_paths_pass_untouched_and_are_counted(
    upstream: FaultyUpstream, client: aiohttp.ClientSession
) -> None:
    exempt = {"requests": {**SLOW, "exempt_cidrs": ["127.0.0.0/8"]}}
    async with sidecar(with_admission(upstream.endpoint, exempt)) as sc:
        answers = await burst(client, sc.url + "/x", 20)
        assert [a[0] for a in answers] == [200] * 20
        assert sc.metric("sidecar_admission_exempted_total", listener="web") == 20
        assert sc.metric("sidecar_admission_attempted_total", listener="web") == 0
    limited = {"requests": {"rate": 0.001, "burst": "1s"}}  # one token, then none for 1000 s
    async with sidecar(with_admission(upstream.endpoint, limited, exempt_paths=["/healthz", "/internal/*"])) as sc:
        assert (await get(client, sc.url + "/x"))[0] == 200
        assert (await get(client, sc.url + "/x"))[0] == 429
        for path in ("/healthz", "/healthz?full=1", "/internal/a/b"):
            assert (await get(client, sc.url + path))[0] == 200
        assert (await get(client, sc.url + "/healthzz"))[0] == 429
        assert sc.metric("sidecar_admission_exempted_total", listener="web") == 3


async def test_queued_requests_go_in_order_when_their_token_is_due(
    upstream: FaultyUpstream, client: aiohttp.ClientSession
) -> None:
    # 20 a second, one at a time: the first goes at once, each next one 50 ms after the one before
    queued = {"requests": {"rate": 20, "burst": "50ms", "max_queue": 10, "max_wait": "5s"}}
    async with sidecar(with_admission(upstream.endpoint, queued)) as sc:
        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(get(client, f"{sc.url}/{i}")))
            await wait_for(lambda i=i: sc.metric("sidecar_admission_attempted_total", listener="web") == i + 1)
        answers = await asyncio.gather(*tasks)
        assert [a[0] for a in answers] == [200] * 5
        assert [s.path for s in upstream.received] == [f"/{i}" for i in range(5)]
        # each waited for its own token: 4 tokens 50 ms apart (a loop timer may fire 1 ms early)
        spread = upstream.received[-1].at - upstream.received[0].at
        assert spread >= 4 * 0.05 - 0.01
        assert sc.metric("sidecar_admission_added_to_queue_total", listener="web") >= 3
        assert sc.metric("sidecar_admission_removed_from_queue_total", listener="web") == sc.metric(
            "sidecar_admission_added_to_queue_total", listener="web"
        )
        assert sc.metric("sidecar_admission_queue_seconds_count", listener="web") >= 3


async def test_a_request_that_would_wait_past_max_wait_is_refused_at_once(
    upstream: FaultyUpstream, client: aiohttp.ClientSession
) -> None:
    profile = {"requests": {"rate": 0.001, "burst": "1s", "max_queue": 10, "max_wait": "100ms"}}
    async with sidecar(with_admission(upstream.endpoint, profile)) as sc:
        assert (await get(client, sc.url + "/a"))[0] == 200
        status, headers, _ = await get(client, sc.url + "/b")
        assert status == 429 and int(headers["Retry-After"]) >= 990  # the next token, 1000 s away (less the run)
        assert sc.metric("sidecar_admission_rejected_total", listener="web", reason="max-wait") == 1
        assert upstream.hits == 1


async def test_a_client_that_leaves_while_queued_gives_its_token_back(upstream: FaultyUpstream) -> None:
    profile = {"requests": {"rate": 0.01, "burst": "1s", "max_queue": 10, "max_wait": "none"}}
    async with sidecar(with_admission(upstream.endpoint, profile)) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.write(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")  # waits 100 s for its token
        await wait_for(lambda: sc.metric("sidecar_admission_added_to_queue_total", listener="web") == 1)
        reset(writer)  # gone (a half-close would still be answered)
        await wait_for(lambda: sc.metric("sidecar_admission_interrupted_in_queue_total", listener="web") == 1)
        assert upstream.hits == 1
        bucket = sc.app.services.door("web").requests
        assert bucket is not None and bucket.queued == 0


async def test_shadow_mode_refuses_nothing_and_counts_everything(
    upstream: FaultyUpstream, client: aiohttp.ClientSession
) -> None:
    async with sidecar(with_admission(upstream.endpoint, {"requests": SLOW, "shadow": True})) as sc:
        began = time.monotonic()
        answers = await burst(client, sc.url + "/x", 20)
        elapsed = time.monotonic() - began
        assert [a[0] for a in answers] == [200] * 20
        assert upstream.hits == 20
        shadow = {"listener": "web", "shadow": "true"}
        assert sc.metric("sidecar_admission_attempted_total", **shadow) == 20
        assert sc.metric("sidecar_admission_rejected_total", **shadow) >= 20 - 5 - int(elapsed) - 1
        assert sc.metric("sidecar_admission_rejected_total", listener="web", shadow="false") == 0


async def test_a_connection_flood_is_closed_before_any_reply_while_existing_connections_work(
    upstream: FaultyUpstream,
) -> None:
    profile = {"connections": {"rate": 0.001, "burst": "1s", "max_queue": 0}}  # one connection, then none
    async with sidecar(with_admission(upstream.endpoint, profile)) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        request = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
        assert (await exchange(reader, writer, request)).startswith(b"HTTP/1.1 200")
        for _ in range(10):
            assert await closed_without_reply(sc.host, sc.port, request)
        # the connection admitted before the flood still works
        assert (await exchange(reader, writer, request)).startswith(b"HTTP/1.1 200")
        writer.close()
        assert upstream.hits == 2
        labels = {"listener": "web", "limiter": "connections"}
        assert sc.metric("sidecar_admission_rejected_total", reason="rate-exceeded", **labels) == 10
        assert sc.metric("sidecar_admission_successful_total", **labels) == 1


async def test_bypass_addresses_are_never_limited_and_queued_connections_are_served(
    upstream: FaultyUpstream, client: aiohttp.ClientSession
) -> None:
    bypass = {"connections": {"rate": 0.001, "burst": "1s", "max_queue": 0, "bypass_cidrs": ["127.0.0.1/32"]}}
    async with sidecar(with_admission(upstream.endpoint, bypass)) as sc:
        for _ in range(5):
            async with aiohttp.ClientSession() as fresh:  # a new connection each time
                assert (await get(fresh, sc.url + "/x"))[0] == 200
        assert sc.metric("sidecar_admission_exempted_total", listener="web", limiter="connections") == 5
    queue = {"connections": {"rate": 20, "burst": "50ms", "max_queue": 10}}
    async with sidecar(with_admission(upstream.endpoint, queue)) as sc:
        answers = await asyncio.gather(*(one_connection(sc.host, sc.port) for _ in range(5)))
        assert all(a.startswith(b"HTTP/1.1 200") for a in answers)
        assert sc.metric("sidecar_admission_added_to_queue_total", listener="web", limiter="connections") >= 1


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> bytes:
    """One request on a kept-alive connection; its whole answer (the upstream's body has a length)."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return head + await reader.readexactly(length)


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (SO_LINGER 0), as a client that went away."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def one_connection(host: str, port: int) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"GET /q HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return await reader.read(-1)
    finally:
        writer.close()


async def closed_without_reply(host: str, port: int, request: bytes) -> bool:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        try:
            return await reader.read(-1) == b""
        except ConnectionResetError:
            return True
    finally:
        writer.close()


async def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    """Poll ``predicate`` (no fixed sleep): true well within ``timeout`` on a loaded machine."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)
