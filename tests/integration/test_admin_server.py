"""The admin port's HTTP/1.1 server (sidecar/admin/server.py) with real clients: aiohttp, curl, and raw sockets
for what a well-behaved client never sends (pipelining, malformed, oversized, slow, unread answers)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import aiohttp
import pytest
import uvloop

from sidecar.admin.routes import AdminRequest, AdminResponse, as_json, text
from sidecar.admin.server import AdminServer, Limits
from sidecar.telemetry.exposition import CounterFamily, Registry
from tests.metrics import until


def on_both_loops(case: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[str], None]:
    """The test ``case`` on asyncio's own loop and on uvloop's (what ``sidecar run`` uses)."""

    @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
    def test(loop: str) -> None:
        (uvloop.run if loop == "uvloop" else asyncio.run)(case())

    test.__name__, test.__doc__ = case.__name__, case.__doc__
    return test


class Things:
    def collect(self) -> list[CounterFamily]:
        return [CounterFamily("things", "Things counted", value=3)]


@contextlib.asynccontextmanager
async def admin(limits: Limits = Limits(), listen: str = "127.0.0.1:0") -> AsyncIterator[AdminServer]:
    registry = Registry()
    registry.register(Things())
    server = AdminServer(
        listen, registry=registry, ready=lambda: True, effective_config={"listeners": []}, limits=limits
    )
    seen: list[AdminRequest] = []

    def echo(request: AdminRequest) -> AdminResponse:
        seen.append(request)
        return as_json(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "peer": request.peer,
            }
        )

    def broken(request: AdminRequest) -> AdminResponse:
        raise RuntimeError("a page's bug")

    server.add("/echo", echo)
    server.add("/echo/with space", echo)
    server.add("/broken", broken)
    server.add(
        "/bad-header", lambda r: AdminResponse(200, b"x", headers=(("X-Split", "a\r\nInjected: yes"),))
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def raw(server: AdminServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*server.address)


def url(server: AdminServer, path: str = "") -> str:
    host, port = server.address
    return f"http://{host}:{port}{path}"


async def read_response(
    reader: asyncio.StreamReader, head: bool = False
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length (what the admin server always sends); ``head``: to HEAD."""
    raw_head = await reader.readuntil(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:] if line)}
    body = b"" if head else await reader.readexactly(int(headers["content-length"]))
    return status, headers, body


async def closed(reader: asyncio.StreamReader) -> bool:
    """The server closed the connection (EOF, or a reset)."""
    try:
        return await reader.read(65536) == b""
    except ConnectionResetError:
        return True


@on_both_loops
async def test_pages_404_405_head_query_and_peer() -> None:
    async with admin() as server, aiohttp.ClientSession() as http:
        base = url(server)
        async with http.get(base + "/healthz") as r:
            assert (r.status, await r.text()) == (200, "ok\n")
        async with http.get(base + "/metrics") as r:
            assert r.status == 200 and "things_total 3.0\n" in await r.text()
            assert r.headers["Content-Type"].startswith("text/plain")
        async with http.get(base + "/config") as r:
            assert await r.json() == {"listeners": []}
        async with http.get(base + "/nothing-here") as r:
            assert r.status == 404
        async with http.post(base + "/healthz", data=b"x") as r:
            assert r.status == 405 and r.headers["Allow"] == "GET, HEAD"
        async with http.head(base + "/metrics") as r:
            assert r.status == 200 and int(r.headers["Content-Length"]) > 0 and await r.read() == b""
        async with http.get(base + "/echo?a=1&b=&a=2&c=x%20y") as r:
            assert await r.json() == {
                "method": "GET",
                "path": "/echo",
                "query": {"a": "1", "b": "", "c": "x y"},  # the first value of each, as before
                "peer": "127.0.0.1",
            }
        async with http.get(base + "/echo/with%20space") as r:
            assert (await r.json())["path"] == "/echo/with space"


@on_both_loops
async def test_keep_alive_serves_many_requests_on_one_connection() -> None:
    if shutil.which("curl") is None:
        pytest.fail("curl is missing (tools/test-deps.sh installs it)")
    async with admin() as server:
        base = url(server)
        r = await asyncio.to_thread(
            subprocess.run,
            ["curl", "-sv", base + "/healthz", base + "/readyz", base + "/echo"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("ok\nready\n{")
        assert r.stderr.count("Connected to") == 1 and "Re-using existing connection" in r.stderr


@on_both_loops
async def test_pipelined_requests_are_answered_in_order_and_http10_closes() -> None:
    async with admin() as server:
        reader, writer = await raw(server)
        writer.write(
            b"GET /echo?n=1 HTTP/1.1\r\nHost: a\r\n\r\n"
            b"HEAD /healthz HTTP/1.1\r\nHost: a\r\n\r\n"
            b"GET /echo?n=3 HTTP/1.1\r\nHost: a\r\n\r\n"
        )
        first = await read_response(reader)
        head = await read_response(reader, head=True)
        third = await read_response(reader)
        assert b'"n": "1"' in first[2] and b'"n": "3"' in third[2]
        assert head[0] == 200 and head[1]["content-length"] == "3" and head[2] == b""
        writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
        status, headers, body = await read_response(reader)
        assert (status, body, headers["connection"]) == (200, b"ok\n", "close")
        assert await closed(reader)
        writer.close()


@on_both_loops
async def test_a_route_that_waits_holds_up_only_its_own_connection() -> None:
    async with admin() as server:
        release = asyncio.Event()

        async def long_poll(request: AdminRequest) -> AdminResponse:
            await release.wait()
            return text("news\n")

        server.add("/poll", long_poll)
        r1, w1 = await raw(server)
        w1.write(b"GET /poll HTTP/1.1\r\nHost: a\r\n\r\n")
        async with aiohttp.ClientSession() as http:
            for _ in range(3):  # other clients are answered while the poll waits
                async with http.get(url(server, "/healthz")) as r:
                    assert r.status == 200
        release.set()
        assert (await read_response(r1))[2] == b"news\n"
        w1.close()


@on_both_loops
async def test_malformed_oversized_and_broken_requests_end_only_their_connection() -> None:
    async with admin(Limits(max_head=1024, max_body=100)) as server:
        cases = [
            (b"GARBAGE\r\n\r\n", 400),
            (b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Big: " + b"x" * 2000 + b"\r\n\r\n", 431),
            (b"GET /healthz HTTP/1.1\r\nX-Big: " + b"x" * 2000, 431),  # never ends its head
            (b"POST /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n" + b"y" * 1000, 413),
        ]
        for request, status in cases:
            reader, writer = await raw(server)
            writer.write(request)
            assert (await read_response(reader))[0] == status, request[:40]
            assert await closed(reader)
            writer.close()
        async with aiohttp.ClientSession() as http:
            base = url(server)
            async with http.get(base + "/broken") as r:
                assert (r.status, await r.text()) == (500, "internal error\n")
            async with http.get(base + "/bad-header") as r:
                assert r.status == 500 and "Injected" not in r.headers
            async with http.get(base + "/healthz") as r:
                assert r.status == 200


@on_both_loops
async def test_an_answer_before_a_refusal_is_still_sent() -> None:
    async with admin() as server:
        reader, writer = await raw(server)
        writer.write(b"GET /echo?n=1 HTTP/1.1\r\nHost: a\r\n\r\nBROKEN REQUEST\r\n\r\n")
        assert (await read_response(reader))[0] == 200
        assert (await read_response(reader))[0] == 400
        assert await closed(reader)
        writer.close()


@on_both_loops
async def test_slow_and_idle_clients_are_closed() -> None:
    async with admin(Limits(request_timeout=0.2, idle_timeout=0.3)) as server:
        slow_reader, slow = await raw(server)
        slow.write(b"GET /healthz HTTP/1.1\r\nHo")  # and nothing more
        idle_reader, idle = await raw(server)
        idle.write(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        assert (await read_response(idle_reader))[0] == 200
        assert await asyncio.wait_for(closed(slow_reader), 5)
        assert await asyncio.wait_for(closed(idle_reader), 5)
        slow.close()
        idle.close()


@on_both_loops
async def test_a_client_that_reads_no_answers_is_not_read_and_then_closed() -> None:
    big = b"x" * (1 << 20)
    async with admin(Limits(idle_timeout=0.5, max_pipelined=4)) as server:
        server.add("/big", lambda r: AdminResponse(200, big))
        reader, writer = await raw(server)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        request = b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n"
        writer.write(request * 4)  # 4 MB of answers asked for, none read
        async with aiohttp.ClientSession() as http, http.get(url(server, "/healthz")) as r:
            assert r.status == 200
        await until(lambda: server.connections == 0, "the client that reads nothing closed")
        writer.close()


@on_both_loops
async def test_requests_sent_far_ahead_of_their_answers_are_bounded() -> None:
    async with admin(Limits(max_pipelined=4)) as server:
        reader, writer = await raw(server)
        writer.write(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n" * 40)  # one read holds them all
        statuses = [(await read_response(reader))[0] for _ in range(5)]
        assert statuses == [200, 200, 200, 200, 429]
        assert await closed(reader)
        writer.close()
        reader, writer = await raw(server)  # a client sending them a few at a time is read as it goes
        for _ in range(10):
            writer.write(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n" * 3)
            for _ in range(3):
                assert (await read_response(reader))[0] == 200
        writer.close()


@on_both_loops
async def test_connections_beyond_the_limit_wait_until_one_closes() -> None:
    async with admin(Limits(max_connections=2)) as server:
        held = [await raw(server) for _ in range(2)]
        for reader, writer in held:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
            assert (await read_response(reader))[0] == 200
        reader3, writer3 = await raw(server)  # completes in the kernel's backlog
        writer3.write(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        waiting = asyncio.ensure_future(read_response(reader3))
        done, _ = await asyncio.wait([waiting], timeout=0.3)
        assert not done  # not accepted while two are open
        held[0][1].close()
        assert (await asyncio.wait_for(waiting, 5))[0] == 200
        for _, writer in held[1:]:
            writer.close()
        writer3.close()


@on_both_loops
async def test_an_upgrade_request_is_answered_then_closed() -> None:
    async with admin() as server:
        reader, writer = await raw(server)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        status, headers, _ = await read_response(reader)
        assert status == 200 and headers["connection"] == "close"
        assert await closed(reader)
        writer.close()
