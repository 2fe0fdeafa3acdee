"""userver deadline propagation end to end: X-YaTaxi-Client-TimeoutMs in, rewritten per attempt, 498 out."""

from __future__ import annotations

import asyncio

from sidecar.policy import Reason
from sidecar.testing.http_upstream import Fault

from .conftest import config, sidecar

DL = "X-YaTaxi-Client-TimeoutMs"


async def test_deadline_already_expired_when_the_request_is_read_never_calls_upstream(upstream) -> None:
    async with sidecar(config([upstream.endpoint])) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        writer.write(f"GET / HTTP/1.1\r\nHost: x\r\n{DL}: 10\r\n".encode())
        await writer.drain()
        await asyncio.sleep(0.05)  # a slow client: the head completes after its 10 ms deadline
        writer.write(b"\r\n")
        answer = await reader.readuntil(b"Deadline expired")
        writer.close()
        assert answer.startswith(b"HTTP/1.1 498 Deadline Expired\r\n")
        assert b"X-YaTaxi-Deadline-Expired: 1\r\n" in answer
        assert upstream.hits == 0
        assert sc.metric("sidecar_deadline_received_total") == 1
        assert sc.requests(Reason.DEADLINE) == 1


async def test_deadline_expiring_during_a_slow_attempt_answers_498_and_cancels_it(client, upstream) -> None:
    upstream.then(Fault(hang=True))
    async with sidecar(config([upstream.endpoint])) as sc:
        async with client.get(sc.url + "/", headers={DL: "300"}) as r:
            assert r.status == 498
            assert r.headers["X-YaTaxi-Deadline-Expired"] == "1"
            assert await r.text() == "Deadline expired"
        await upstream.wait_cancelled(1)  # the upstream saw its request abandoned
        assert upstream.hits == 1
        assert sc.metric("sidecar_cancelled_by_deadline_total") == 1
        assert sc.metric("sidecar_deadline_expired_total") == 1


async def test_expired_status_is_configurable(client, upstream) -> None:
    upstream.then(Fault(hang=True))
    async with (
        sidecar(config([upstream.endpoint], {"deadline": {"expired_status": 504}})) as sc,
        client.get(sc.url + "/", headers={DL: "100"}) as r,
    ):
        assert r.status == 504 and r.headers["X-YaTaxi-Deadline-Expired"] == "1"


async def test_upstream_deadline_expired_with_the_whole_deadline_ends_the_request(client, upstream) -> None:
    upstream.then(Fault(deadline_expired=True))
    policy = {"retry_on": ["unavailable", "timeout"]}  # even a retryable timeout is not retried here
    async with sidecar(config([upstream.endpoint], policy)) as sc:
        async with client.get(sc.url + "/", headers={DL: "1000"}) as r:  # < per-try 2 s: the whole deadline
            assert r.status == 498 and await r.text() == "Deadline expired"
        assert upstream.hits == 1
        assert upstream.received[0].timeout_ms is not None and upstream.received[0].timeout_ms <= 1000


async def test_upstream_deadline_expired_without_the_whole_deadline_is_a_timeout(client, upstream) -> None:
    upstream.then(Fault(deadline_expired=True), Fault(deadline_expired=True))
    retrying = {"retry_on": ["unavailable", "timeout"], "per_try_timeout": "1s"}
    async with sidecar(config([upstream.endpoint], retrying)) as sc:
        async with client.get(sc.url + "/", headers={DL: "5000"}) as r:  # per-try 1 s < 5 s: retried
            assert r.status == 200
        assert upstream.hits == 3
        assert sc.metric("sidecar_retries_total", outcome="timeout") == 2
    upstream.then(Fault(deadline_expired=True, body=b"secret"))
    async with (
        sidecar(config([upstream.endpoint], {"per_try_timeout": "1s"})) as sc,
        client.get(sc.url + "/", headers={DL: "5000"}) as r,
    ):  # timeout not retryable here
        assert r.status == 504
        text = await r.text()
        assert "timed out" in text and "secret" not in text  # never the upstream's body


async def test_rewritten_timeout_header_is_never_more_than_what_remains(client, upstream) -> None:
    upstream.then(Fault(503, delay=0.2), Fault(503, delay=0.2))
    async with (
        sidecar(config([upstream.endpoint], {"per_try_timeout": "10s"})) as sc,
        client.get(sc.url + "/", headers={DL: "2500"}) as r,
    ):
        assert r.status == 200
    first, second, third = upstream.received
    # The request began to arrive before the first hit; attempt k was written after the answer to
    # attempt k-1, which came 0.2 s after that hit. So what remained for attempt k was at most:
    assert first.timeout_ms <= 2500
    assert second.timeout_ms <= (first.at + 2.5 - (first.at + 0.2)) * 1000
    assert third.timeout_ms <= (first.at + 2.5 - (second.at + 0.2)) * 1000
    assert third.timeout_ms < second.timeout_ms < first.timeout_ms


async def test_the_per_try_timeout_caps_the_propagated_timeout(client, upstream) -> None:
    async with (
        sidecar(config([upstream.endpoint], {"per_try_timeout": "2s"})) as sc,
        client.get(sc.url + "/", headers={DL: "5000"}) as r,
    ):
        assert r.status == 200
    assert 1000 < upstream.received[0].timeout_ms <= 2000


async def test_unparseable_or_absurd_deadlines_are_ignored(client, upstream) -> None:
    async with sidecar(config([upstream.endpoint], {"deadline": {"default": "10s"}})) as sc:
        for value in ("soon", "-5", "1e30", ""):
            async with client.get(sc.url + "/", headers={DL: value}) as r:
                assert r.status == 200
        assert sc.metric("sidecar_deadline_received_total") == 0
    assert all(1000 < s.timeout_ms <= 2000 for s in upstream.received)  # the policy's own limits
