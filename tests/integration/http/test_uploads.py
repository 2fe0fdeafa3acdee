"""Slow and stalled uploads (issue 11 item 3): the per-try timeout and the sidecar's own deadline start once
the whole request is upstream (Envoy's rule); an upload still flowing is never a timeout, one that stalls is
bounded by ``request_body_timeout`` (408).

The clients here are slow on purpose: the pauses between their pieces are the behaviour under test (a slow
sender), not a wait for something to happen; every wait for the sidecar is on its answer."""

from __future__ import annotations

import asyncio

from sidecar.policy import Reason

from .conftest import config, sidecar

#: A per-try timeout and a default deadline far shorter than the uploads below take.
SHORT = {"per_try_timeout": "300ms", "deadline": {"default": "500ms"}}


async def test_an_upload_slower_than_the_per_try_timeout_is_not_a_timeout(upstream) -> None:
    async with sidecar(config([upstream.endpoint], SHORT)) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        writer.write(b"PUT /up HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(10):  # 100 bytes every 0.1 s: about 1 s, three per-try timeouts, two default deadlines
            writer.write(b"u" * 100)
            await writer.drain()
            await asyncio.sleep(0.1)
        head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
        assert [s.body_len for s in upstream.received] == [1000]
        # nothing told the upstream a deadline while the body came (the client sent none)
        assert upstream.received[0].timeout_ms is None
        assert sc.requests(Reason.SUCCESS) == 1


async def test_a_late_body_after_100_continue_is_not_a_timeout(upstream) -> None:
    async with sidecar(config([upstream.endpoint], SHORT)) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        writer.write(b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        await asyncio.sleep(
            0.8
        )  # the client takes its time, past the per-try timeout and the default deadline
        writer.write(b"hello")
        head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
        assert upstream.received[0].body_len == 5


async def test_the_per_try_timeout_starts_once_the_body_is_complete(upstream) -> None:
    from sidecar.testing.http_upstream import Fault

    upstream.then(Fault(hang=True))
    async with sidecar(config([upstream.endpoint], {**SHORT, "max_attempts": 1})) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        writer.write(b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
        await upstream.wait_hits(1)
        writer.write(b"cd")  # complete: from now on the hanging upstream has 300 ms
        head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        assert head.startswith(b"HTTP/1.1 504 "), head
        await upstream.wait_cancelled(1)


async def test_a_stalled_upload_gets_408_and_its_attempt_is_abandoned(upstream) -> None:
    cfg = config([upstream.endpoint], listener={"request_body_timeout": "300ms"})
    async with sidecar(cfg) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        writer.write(b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly ten b")
        out = await reader.read()  # the sidecar answers, then closes
        writer.close()
        assert out.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), out
        assert b"request_body_timeout" in out
        await upstream.wait_cancelled(1)
        assert sc.metric("sidecar_rejected_total", reason="408") == 1
        # an Expect: 100-continue client that never sends its body is bounded the same way
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        writer.write(b"PUT /y HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        out = await reader.read()
        writer.close()
        assert b"HTTP/1.1 408 Request Timeout\r\n" in out
