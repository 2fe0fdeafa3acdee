"""HTTP/1.1 on the wire: bodies both ways, framing, keep-alive, pipelining, 100-continue, bad input."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import socket
import struct

import aiohttp
import pytest

from sidecar.config import ConfigError, load_dict
from sidecar.policy import Reason
from sidecar.testing.http_upstream import Fault

from .conftest import config, raw, sidecar

MiB = 1024 * 1024


async def test_a_5mib_upload_is_streamed_once_and_not_retried(client, upstream) -> None:
    upstream.fail_next(2, 503)
    async with sidecar(config([upstream.endpoint])) as sc:
        async with client.put(sc.url + "/blob", data=b"u" * (5 * MiB)) as r:  # idempotent, but too big
            assert r.status == 503
        assert upstream.hits == 1 and upstream.received[0].body_len == 5 * MiB

        async def chunks():  # no Content-Length: the overflow is found mid-stream
            for _ in range(5):
                yield b"c" * MiB

        async with client.put(sc.url + "/blob", data=chunks()) as r:
            assert r.status == 503
        assert upstream.hits == 2 and upstream.received[1].body_len == 5 * MiB
        assert sc.requests(Reason.BUFFER_EXCEEDED) == 2
        assert sc.metric("sidecar_buffer_exceeded_total") == 2


async def test_a_body_within_the_replay_buffer_is_replayed(client, upstream) -> None:
    upstream.fail_next(1, 503)
    async with sidecar(config([upstream.endpoint])) as sc:

        async def chunks():
            for _ in range(4):
                yield b"r" * 100_000

        async with client.put(sc.url + "/doc", data=chunks()) as r:
            assert r.status == 200
        assert [s.body_len for s in upstream.received] == [400_000, 400_000]


async def test_a_large_download_streams_through_without_being_held(client, upstream) -> None:
    size = 128 * MiB
    async with sidecar(config([upstream.endpoint])) as sc:
        base = _rss()
        peak = base
        got = 0
        async with client.get(sc.url + f"/bytes/{size}?chunked=1") as r:
            assert r.status == 200 and r.headers["Transfer-Encoding"] == "chunked"
            async for chunk in r.content.iter_chunked(MiB):
                got += len(chunk)
                peak = max(peak, _rss())
        assert got == size
        assert peak - base < 48 * MiB  # the client, the sidecar and the upstream together held little


async def test_head_204_304_and_pipelined_requests_keep_their_framing(upstream) -> None:
    upstream.then(Fault(204, body=b""), Fault(304, body=b"", headers=(("ETag", '"v1"'),)))
    async with sidecar(config([upstream.endpoint])) as sc:
        reqs = (
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n"
            b"HEAD /bytes/1000 HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        data = await raw(sc.host, sc.port, reqs)
    answers = data.split(b"HTTP/1.1 ")[1:]
    assert [a[:3] for a in answers] == [b"204", b"304", b"200", b"200"]
    assert b'ETag: "v1"' in answers[1]
    assert b"Content-Length: 1000" in answers[2] and answers[2].endswith(b"\r\n\r\n")  # HEAD: no body
    assert answers[3].endswith(b"\r\n\r\nok\n")
    assert [s.path for s in upstream.received] == ["/a", "/b", "/bytes/1000", "/c"]


async def test_chunked_request_and_response_bodies(client, upstream) -> None:
    async with sidecar(config([upstream.endpoint])) as sc:
        data = await raw(
            sc.host,
            sc.port,
            b"POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        )
        assert data.startswith(b"HTTP/1.1 200 OK\r\n")
        assert upstream.received[0].body_len == 11
        assert upstream.received[0].headers.get("Transfer-Encoding") == "chunked"
        async with client.get(sc.url + "/bytes/300000?chunked=1") as r:
            assert len(await r.read()) == 300000


async def test_expect_100_continue(upstream) -> None:
    async with sidecar(config([upstream.endpoint])) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        writer.write(b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hello")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        writer.close()
    assert upstream.received[0].body_len == 5 and "Expect" not in upstream.received[0].headers


async def test_http_1_0_client_gets_a_close_delimited_body(upstream) -> None:
    async with sidecar(config([upstream.endpoint])) as sc:
        data = await raw(sc.host, sc.port, b"GET /bytes/70000?chunked=1 HTTP/1.0\r\n\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding" not in head and b"Connection: close" in head
    assert len(body) == 70000


async def test_http_1_0_keep_alive_client_is_told_and_kept(upstream) -> None:
    # The version is only asked of the parser when a request is not plainly HTTP/1.1 (kept alive without a
    # Connection header): an HTTP/1.0 client asking for keep-alive must still be answered as one.
    async with sidecar(config([upstream.endpoint])) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        try:
            for _ in range(2):
                writer.write(b"GET /bytes/10 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200") and b"Connection: keep-alive\r\n" in head
                assert b"Transfer-Encoding" not in head  # no chunked framing for an HTTP/1.0 client
                assert len(await reader.readexactly(10)) == 10
        finally:
            writer.close()
    assert len(upstream.received) == 2


async def test_hop_by_hop_headers_are_dropped_and_forwarding_headers_added(client, upstream) -> None:
    async with sidecar(config([upstream.endpoint])) as sc:
        headers = {
            "Connection": "keep-alive, X-Private",
            "X-Private": "secret",
            "Keep-Alive": "timeout=5",
            "TE": "trailers",
            "X-Forwarded-For": "10.1.2.3",
            "X-Custom": "kept",
            "x-sidecar-attempt": "7",
        }
        async with client.get(sc.url + "/", headers=headers) as r:
            assert r.status == 200
    seen = upstream.received[0].headers
    for gone in ("X-Private", "Keep-Alive", "TE"):
        assert gone not in seen
    assert seen["X-Custom"] == "kept"
    assert seen["X-Forwarded-For"] == "10.1.2.3, 127.0.0.1" and seen["X-Forwarded-Proto"] == "http"
    assert seen["x-sidecar-attempt"] == "1"  # the client's own value is not passed on
    assert seen["Host"] == upstream.endpoint  # the app named the sidecar: the upstream is told its name


async def test_a_virtual_host_is_passed_on(client, upstream) -> None:
    async with (
        sidecar(config([upstream.endpoint])) as sc,
        client.get(sc.url + "/", headers={"Host": "orders.internal"}) as r,
    ):
        assert r.status == 200
    assert upstream.received[0].headers["Host"] == "orders.internal"


async def test_malformed_requests_get_400_and_other_connections_carry_on(client, upstream) -> None:
    async with sidecar(config([upstream.endpoint])) as sc:
        async with client.get(sc.url + "/before") as r:  # a keep-alive connection, open throughout
            assert r.status == 200
        bad = await raw(sc.host, sc.port, b"GET / HTTP/1.1\r\nHo st: x\r\n\r\n")
        assert bad.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"malformed request" in bad
        bad = await raw(sc.host, sc.port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64))
        assert bad.startswith(b"HTTP/1.1 400 Bad Request\r\n")  # TLS spoken to a plain listener
        huge = await raw(sc.host, sc.port, b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
        assert huge.startswith(b"HTTP/1.1 431 ")
        connect = await raw(
            sc.host, sc.port, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n"
        )
        assert connect.startswith(b"HTTP/1.1 405 ")
        async with client.get(sc.url + "/after") as r:
            assert r.status == 200
        assert [s.path for s in upstream.received] == ["/before", "/after"]
        assert sc.metric("sidecar_rejected_total") == 4


async def test_client_going_away_cancels_the_upstream_request(upstream) -> None:
    upstream.then(Fault(hang=True), Fault(hang=True))
    async with sidecar(config([upstream.endpoint])) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await upstream.wait_hits(1)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not FIN
        writer.close()
        await upstream.wait_cancelled(1)
        assert sc.requests(Reason.CANCELLED) == 1
        # A client that ends its side in the middle of a body can never complete its request: dropped.
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        writer.write(b"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        await upstream.wait_hits(2)
        writer.write_eof()
        await upstream.wait_cancelled(2)
        assert await reader.read() == b""
        assert sc.requests(Reason.CANCELLED) == 2


async def test_a_client_that_half_closes_after_its_requests_gets_the_answers(upstream) -> None:
    async with sidecar(config([upstream.endpoint])) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        writer.write(
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
        )
        writer.write_eof()
        out = await reader.read()  # until the sidecar closes, once both are answered
        writer.close()
        assert out.count(b"HTTP/1.1 200 OK\r\n") == 2
        assert [s.path for s in upstream.received] == ["/a", "/b"]


async def test_upstream_connections_are_kept_alive_and_reused(client, upstream) -> None:
    upstream.then(Fault(503), Fault(404), Fault(204, body=b""))
    async with sidecar(config([upstream.endpoint])) as sc:
        for path in ("/a", "/b", "/c", "/d"):  # a retried 503, a 404, a 204, a 200
            async with client.get(sc.url + path) as r:
                await r.read()
        async with client.head(sc.url + "/bytes/10") as r:
            assert r.status == 200
        async with client.get(sc.url + "/bytes/100000?chunked=1") as r:
            assert len(await r.read()) == 100000
        async with client.get(sc.url + "/e") as r:
            assert r.status == 200
    assert upstream.hits == 8
    assert len({s.peer for s in upstream.received}) == 1  # one upstream connection carried them all


async def test_many_concurrent_clients(upstream) -> None:
    async with sidecar(config([upstream.endpoint])) as sc:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=50)) as s:

            async def one(i: int) -> int:
                async with s.get(sc.url + f"/n/{i}") as r:
                    await r.read()
                    return r.status

            statuses = await asyncio.gather(*(one(i) for i in range(400)))
        assert statuses == [200] * 400 and upstream.hits == 400


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_stop_lets_requests_in_flight_finish_and_refuses_new_ones(client, upstream) -> None:
    upstream.then(Fault(200, delay=0.3, body=b"finished"))
    async with sidecar(config([upstream.endpoint])) as sc:
        pending = asyncio.create_task(client.get(sc.url + "/slow"))
        await upstream.wait_hits(1)
        await sc.app.stop(grace=5.0)
        r = await pending
        assert r.status == 200 and await r.read() == b"finished"
        assert r.headers.get("Connection") == "close"
        try:
            await asyncio.open_connection(sc.host, sc.port)
        except OSError:
            pass
        else:  # pragma: no cover
            raise AssertionError("the listener still accepts connections after stop")


async def test_a_client_that_never_finishes_its_head_gets_408(upstream) -> None:
    async with sidecar(config([upstream.endpoint], listener={"idle_timeout": "200ms"})) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and nothing more
        answer = await reader.read(-1)  # the sweeper (once a second) answers and closes
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408 ") and b"idle_timeout" in answer
        assert upstream.hits == 0


async def test_a_malformed_upstream_answer_is_a_reset_and_the_sidecar_carries_on(client, upstream) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 2x0 What\r\nContent-Length: nope\r\n\r\n")
        await writer.drain()
        writer.close()

    bad = await asyncio.start_server(garbage, "127.0.0.1", 0)
    bad_ep = f"127.0.0.1:{bad.sockets[0].getsockname()[1]}"
    try:
        async with sidecar(config([bad_ep, upstream.endpoint])) as sc:  # rand 0: the broken one first
            async with client.get(sc.url + "/") as r:
                assert r.status == 200  # retried elsewhere
            assert sc.metric("sidecar_attempts_total", outcome="reset") == 1
        async with sidecar(config([bad_ep])) as sc, client.get(sc.url + "/") as r:
            assert r.status == 502 and "reset" in await r.text()
    finally:
        bad.close()
        await bad.wait_closed()


async def test_random_bytes_never_hurt_other_connections(client, upstream) -> None:
    rng = random.Random(5)
    async with sidecar(config([upstream.endpoint])) as sc:
        async with client.get(sc.url + "/first") as r:
            assert r.status == 200
        for _ in range(40):
            junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
            if rng.random() < 0.5:  # a plausible start, then junk
                junk = b"GET /x HTTP/1.1\r\nHost: a\r\n" + junk
            reader, writer = await asyncio.open_connection(sc.host, sc.port)
            writer.write(junk)
            writer.write_eof()
            await reader.read(-1)  # whatever the answer, the connection ends
            writer.close()
        async with client.get(sc.url + "/last") as r:
            assert r.status == 200
    assert upstream.received[0].path == "/first" and upstream.received[-1].path == "/last"


async def test_max_connections_makes_requests_wait_for_a_pooled_connection(client, upstream) -> None:
    upstream.then(Fault(200, delay=0.1, body=b"a"), Fault(200, delay=0.1, body=b"b"))
    cfg = config([upstream.endpoint])
    cfg["upstreams"]["api"]["max_connections"] = 1
    async with sidecar(cfg) as sc:

        async def get(path: str) -> bytes:
            async with client.get(sc.url + path) as r:
                return await r.read()

        bodies = await asyncio.gather(get("/1"), get("/2"), get("/3"))
    assert sorted(bodies) == [b"a", b"b", b"ok\n"]
    assert len({s.peer for s in upstream.received}) == 1  # one connection, taken in turn


async def test_an_answered_request_is_freed_at_once_not_by_the_cycle_collector(client, upstream) -> None:
    """A request's objects (forwarding, driver, engine call, attempt contexts) hold no reference cycle: once
    it is answered they are freed by reference counting, not left for the collector to find."""
    upstream.fail_next(1, 503)  # a retried attempt's objects too
    async with sidecar(config([upstream.endpoint])) as sc:
        gc.collect()
        gc.disable()
        try:
            for _ in range(20):
                async with client.get(sc.url + "/x") as r:
                    assert r.status == 200
                    await r.read()
            kinds = {"Forwarding", "Driver", "Call", "AttemptContext", "Attempter", "Exchange"}
            left = sorted(type(o).__name__ for o in gc.get_objects() if type(o).__name__ in kinds)
        finally:
            gc.enable()
        assert left == []


async def test_stop_closes_idle_keepalive_connections_at_once_and_counts_only_busy_ones(
    client, upstream, caplog
) -> None:
    """The drain (adapters/connections.py): a keep-alive connection between requests is closed at once; one
    answered during the grace closes then; one whose answer does not come in time is dropped after the
    grace, and the log counts only that one (it counted every connection busy when the drain began)."""
    upstream.then(Fault(200), Fault(200, hang=True), Fault(200, delay=0.2, body=b"in time"))
    async with sidecar(config([upstream.endpoint], {"per_try_timeout": "none"})) as sc:
        idle_r, idle_w = await asyncio.open_connection(sc.host, sc.port)
        idle_w.write(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await idle_r.readuntil(b"\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 200 ")
        await idle_r.readexactly(int(first.lower().split(b"content-length: ")[1].split(b"\r\n")[0]))
        busy_r, busy_w = await asyncio.open_connection(sc.host, sc.port)
        busy_w.write(b"GET /hangs HTTP/1.1\r\nHost: x\r\n\r\n")
        await upstream.wait_hits(2)
        soon_r, soon_w = await asyncio.open_connection(sc.host, sc.port)
        soon_w.write(b"GET /in-time HTTP/1.1\r\nHost: x\r\n\r\n")
        await upstream.wait_hits(3)
        with caplog.at_level("WARNING", logger="sidecar.http"):
            await sc.app.stop(grace=3.0)  # the 0.2 s answer comes well within it
        assert await asyncio.wait_for(idle_r.read(), 30) == b""  # closed, nothing more said
        assert (await asyncio.wait_for(soon_r.read(), 30)).endswith(b"in time")
        assert await asyncio.wait_for(busy_r.read(), 30) == b""  # dropped: no answer came in time
        for w in (idle_w, busy_w, soon_w):
            w.close()
    warnings = [r.getMessage() for r in caplog.records if "still busy" in r.getMessage()]
    assert warnings == ["listener web: 1 connection(s) still busy after 3.0s; closing"]


async def test_a_head_trickled_past_header_timeout_gets_408_while_other_clients_are_served(
    client, upstream
) -> None:
    """header_timeout bounds the whole head from its first byte: a byte every 50 ms keeps resetting the idle
    timer (60 s here) but not this one."""
    async with sidecar(config([upstream.endpoint], listener={"header_timeout": "300ms"})) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\nX-Trickle: ")

        async def trickle() -> None:
            while True:  # until the sidecar closes the connection (then the write fails or is ignored)
                writer.write(b"a")
                await asyncio.sleep(0.05)  # the slow client's pace, not a wait for the sidecar

        pace = asyncio.create_task(trickle())
        try:
            async with client.get(sc.url + "/meanwhile") as r:  # another connection, served as usual
                assert r.status == 200
            answer = await asyncio.wait_for(reader.read(-1), 30)
        finally:
            pace.cancel()
            writer.close()
        assert answer.startswith(b"HTTP/1.1 408 ") and b"header_timeout (0.3s)" in answer
        assert [s.path for s in upstream.received] == ["/meanwhile"]  # nothing of the slow one went upstream
        assert sc.metric("sidecar_rejected_total", reason="408") == 1


def test_header_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="header_timeout"):
        load_dict(config(["127.0.0.1:1"], listener={"header_timeout": "0s"}))


_CHUNKED_POST = b"POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("request_bytes", "named"),
    [
        (
            b"POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            b"Transfer-Encoding must end in chunked, not 'xchunked'",
        ),
        (
            b"POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            b"Transfer-Encoding",
        ),
        (_CHUNKED_POST + b"5;a=b\nhello\r\n0\r\n\r\n", b"CR after chunk extension"),
        (_CHUNKED_POST + b"0x5\r\nhello\r\n0\r\n\r\n", b"chunk size"),
        (_CHUNKED_POST + b"5\r\nhello\r\n0\r\nContent-Length: 5\r\n\r\n", b"Content-Length"),
        (b"GET / HTTP/1.1\r\nHost: 127.0.0.1:\xb23001\r\n\r\n", b"malformed Host header"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", b"more than one Host header"),
    ],
    ids=[
        "xchunked",
        "chunked-not-last",
        "bare-lf-extension",
        "0x-size",
        "content-length-trailer",
        "host-not-ascii",
        "two-hosts",
    ],
)
async def test_bad_framing_or_host_is_400_before_anything_goes_upstream(
    upstream, request_bytes: bytes, named: bytes
) -> None:
    """RFC 9112: every rule that can reject a request is applied to its head and to each chunk header before
    a byte of it is forwarded; the client gets a 400 naming the problem (it used to get a bare close)."""
    async with sidecar(config([upstream.endpoint])) as sc:
        answer = await asyncio.wait_for(raw(sc.host, sc.port, request_bytes), 30)
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert named in answer and b"Connection: close" in answer
        async with aiohttp.ClientSession() as s, s.get(sc.url + "/next") as r:  # the listener carries on
            assert r.status == 200
    assert [seen.path for seen in upstream.received] == ["/next"]  # nothing of the bad request


async def test_a_chunk_header_broken_after_the_head_went_upstream_is_400_and_the_attempt_ends(
    upstream,
) -> None:
    """The head and a good chunk were forwarded; the next chunk header is malformed: the attempt is
    abandoned (the upstream never sees the body end) and the client gets 400."""
    upstream.then(Fault(200, hang=True))
    async with sidecar(config([upstream.endpoint])) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        try:
            writer.write(_CHUNKED_POST + b"5\r\nhello\r\n")
            await upstream.wait_hits(1)  # the head is upstream
            writer.write(b"0x5\r\nworld\r\n0\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(-1), 30)
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 400 ") and b"chunk size" in answer, answer
        await upstream.wait_cancelled(1)  # the upstream attempt was cut off
        assert sc.metric("sidecar_rejected_total", reason="400") == 1
