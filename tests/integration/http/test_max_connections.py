"""The HTTP listener's ``max_connections``: beyond it new connections wait in the kernel's backlog, and get
in as soon as one leaves."""

from __future__ import annotations

import asyncio

from sidecar.testing.http_upstream import FaultyUpstream

from .conftest import config, sidecar

GET = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"


async def get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(GET)
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    return head.split(b" ")[1]


async def test_max_connections_leaves_the_next_in_the_backlog(upstream: FaultyUpstream) -> None:
    async with sidecar(config([upstream.endpoint], listener={"max_connections": 2})) as sc:
        listener = sc.app.listeners[0]
        first = [await asyncio.open_connection(sc.host, sc.port) for _ in range(2)]
        for r, w in first:
            assert await get(r, w) == b"200"
        r3, w3 = await asyncio.open_connection(sc.host, sc.port)  # the kernel completes the handshake
        w3.write(GET)
        await w3.drain()
        for r, w in first:  # round trips after the third arrived: it would have been accepted by now
            assert await get(r, w) == b"200"
        assert len(listener.connections) == 2
        first[0][1].close()
        async with asyncio.timeout(10):
            head = await r3.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        w3.close()
        first[1][1].close()
