"""Execution control over HTTP (issue 12): every attempt to an endpoint holds a read (GET/HEAD/OPTIONS) or
write ticket while it is outstanding; the upstream, counting the requests it serves at once, never sees more
than the limit; tickets come back however an attempt ends, an abandoned one's after ``abandoned_hold`` (at
once when nothing of it was sent); a full queue is answered 503 with Retry-After.

Real aiohttp clients, the sidecar in-process, a real upstream that holds requests until the test lets them go
(``FaultyUpstream.hold``): nothing sleeps, the tests wait on the upstream's counts and the sidecar's gauges.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import aiohttp

from sidecar.testing.http_upstream import Fault, FaultyUpstream
from tests.metrics import until

from .conftest import config, sidecar


def limited(endpoints: list[str], concurrency: dict[str, Any], policy: dict[str, Any] | None = None) -> dict:
    cfg = config(endpoints, {"per_try_timeout": "60s", **(policy or {})})  # held requests never time out
    cfg["upstreams"]["api"]["concurrency"] = concurrency
    return cfg


async def test_four_tickets_bound_the_upstream_from_32_clients(client) -> None:
    async with (
        FaultyUpstream(hold=asyncio.Event()) as up,
        sidecar(limited([up.endpoint], {"mode": "fixed", "initial": 4, "max_wait": "60s"})) as sc,
    ):
        assert up.hold is not None

        async def one(i: int) -> int:
            method = "GET" if i % 2 else "POST"
            async with client.request(method, f"{sc.url}/{i}", data=None if i % 2 else b"x") as r:
                await r.read()
                return r.status

        calls = [asyncio.ensure_future(one(i)) for i in range(32)]
        await up.wait_in_flight(4)  # two reads and two writes: the read/write split of 4 tickets
        await until(lambda: sc.metric("sidecar_concurrency_queued") == 28, "28 attempts queued")
        assert sc.metric("sidecar_concurrency_in_use", pool="read") == 2
        assert sc.metric("sidecar_concurrency_in_use", pool="write") == 2
        assert up.hits == 4
        up.hold.set()
        assert await asyncio.gather(*calls) == [200] * 32
        assert up.peak_in_flight == 4 and up.hits == 32
        assert sc.metric("sidecar_concurrency_limit") == 4
        assert sc.metric("sidecar_concurrency_in_use") == 0
        assert sc.metric("sidecar_admission_successful_total") == 32
        assert sc.metric("sidecar_admission_added_to_queue_total") == 28
        assert sc.metric("sidecar_admission_queue_seconds_count") == 28


async def test_an_attempt_abandoned_at_its_per_try_timeout_keeps_its_ticket_for_abandoned_hold(
    client,
) -> None:
    """The upstream still holds the timed-out request (it never looks at the closed connection): its ticket
    counts, abandoned, for ``abandoned_hold``; the retry, which needs the one read ticket, waits for it."""
    policy = {"per_try_timeout": "300ms", "max_attempts": 2, "retry_on": ["timeout"]}
    cc = {"mode": "fixed", "initial": 2, "max_wait": "60s", "abandoned_hold": "150ms"}
    async with FaultyUpstream() as up, sidecar(limited([up.endpoint], cc, policy)) as sc:
        up.then(Fault(hang=True))
        async with client.get(sc.url + "/") as r:
            assert r.status == 200
        assert up.hits == 2 and up.received[1].attempt == 2
        first, retry = up.received
        assert first.timeout_ms is not None
        started = first.at - (0.3 - first.timeout_ms / 1000)  # (it told the upstream what was left of 300 ms)
        assert retry.at - started >= 0.3 + 0.15 - 0.002  # the per-try timeout, then the hold (timers: +-1 ms)
        assert sc.metric("sidecar_concurrency_in_use") == 0
        assert sc.metric("sidecar_admission_successful_total", pool="read") == 2
        assert sc.metric("sidecar_admission_added_to_queue_total", pool="read") == 1  # the retry waited


async def test_tickets_of_clients_gone_waiting_come_back_and_holding_stay_abandoned(upstream) -> None:
    upstream.hold = asyncio.Event()
    cc = {"mode": "fixed", "initial": 2, "max_wait": "60s", "abandoned_hold": "60s"}
    async with sidecar(limited([upstream.endpoint], cc)) as sc:
        holding = await _send_get(sc.port, "/a")
        await upstream.wait_in_flight(1)
        waiting = await _send_get(sc.port, "/b")
        await until(lambda: sc.metric("sidecar_concurrency_queued", pool="read") == 1, "one waiter")
        _reset(waiting)  # the waiting client goes away: its attempt leaves the queue
        await until(lambda: sc.metric("sidecar_concurrency_queued") == 0, "the waiter gone")
        assert sc.metric("sidecar_admission_interrupted_in_queue_total", pool="read") == 1
        assert sc.metric("sidecar_concurrency_in_use") == 1
        await asyncio.sleep(2.0)  # the scenario, not a wait: the upstream has had the request for 2 s ...
        _reset(holding)  # ... when its client goes away: its attempt is cancelled, its connection closed ...
        await upstream.wait_cancelled(1)
        # ... which does not tell whether the upstream let the request go: the ticket stays, abandoned, as long
        # again as the request was outstanding (2 s, within abandoned_hold)
        assert sc.metric("sidecar_concurrency_in_use", abandoned="true") == 1
        assert sc.metric("sidecar_concurrency_in_use", abandoned="false") == 0
        later = await _send_get(sc.port, "/c")
        await until(lambda: sc.metric("sidecar_concurrency_queued", pool="read") == 1, "the next one waits")
        assert upstream.hits == 1
        _reset(later)


async def test_an_abandoned_ticket_comes_back_after_abandoned_hold(upstream) -> None:
    upstream.hold = asyncio.Event()
    cc = {"mode": "fixed", "initial": 2, "max_wait": "60s", "abandoned_hold": "50ms"}
    async with sidecar(limited([upstream.endpoint], cc)) as sc:
        holding = await _send_get(sc.port, "/a")
        await upstream.wait_in_flight(1)
        _reset(holding)
        await upstream.wait_cancelled(1)
        await until(lambda: sc.metric("sidecar_concurrency_in_use") == 0, "the ticket back after the hold")
        upstream.hold.set()
        async with aiohttp.ClientSession() as s, s.get(sc.url + "/b") as r:
            assert r.status == 200


async def test_a_client_gone_before_its_request_was_sent_gives_the_ticket_back_at_once(upstream) -> None:
    """One upstream connection (``max_connections: 1``), held by the first request: the second has its
    ticket but waits for the connection. Its client goes away: nothing of it reached the upstream, so its
    ticket comes back at once, whatever ``abandoned_hold`` is."""
    upstream.hold = asyncio.Event()
    cc = {"mode": "fixed", "initial": 6, "max_wait": "60s", "abandoned_hold": "60s"}
    cfg = limited([upstream.endpoint], cc)
    cfg["upstreams"]["api"]["max_connections"] = 1
    async with sidecar(cfg) as sc:
        first = await _send_get(sc.port, "/a")
        await upstream.wait_in_flight(1)
        second = await _send_get(sc.port, "/b")
        await until(lambda: sc.metric("sidecar_concurrency_in_use") == 2, "the second holds a ticket")
        await asyncio.sleep(
            2.0
        )  # the scenario: it has held its ticket 2 s (abandoned, it would keep it 2 s more)
        _reset(second)
        await until(
            lambda: sc.metric("sidecar_concurrency_in_use") == 1, "its ticket back at once", bound=1.0
        )
        assert sc.metric("sidecar_concurrency_in_use", abandoned="true") == 0
        assert upstream.hits == 1
        upstream.hold.set()
        _reset(first)


async def _send_get(port: int, path: str) -> asyncio.StreamWriter:
    """A client that sends a GET and will not wait for its answer (``_reset`` it to go away)."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    return writer


def _reset(writer: asyncio.StreamWriter) -> None:
    """The client goes away at once: a TCP reset (a FIN alone is a half-close, still answered)."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def test_each_hedge_holds_its_own_ticket_and_the_loser_gives_it_back(client) -> None:
    hedge = {"hedging": {"max_attempts": 2, "delay": "0ms"}, "per_try_timeout": "30s"}
    cc = {"mode": "fixed", "initial": 2, "max_wait": "60s", "abandoned_hold": "50ms"}
    async with (
        FaultyUpstream(hold=asyncio.Event()) as slow,
        FaultyUpstream() as fast,
        sidecar(limited([slow.endpoint, fast.endpoint], cc, hedge)) as sc,
    ):  # rand 0: the slow one first
        async with client.get(sc.url + "/") as r:
            assert r.status == 200
        await slow.wait_cancelled(1)
        assert sc.metric("sidecar_admission_successful_total") == 2  # one ticket per endpoint
        await until(lambda: sc.metric("sidecar_concurrency_in_use") == 0, "both tickets back")


async def test_a_full_queue_is_answered_503_with_retry_after(client, upstream) -> None:
    upstream.hold = asyncio.Event()
    async with sidecar(
        limited([upstream.endpoint], {"mode": "fixed", "initial": 2, "max_queue": 0, "max_wait": "2s"})
    ) as sc:
        holding = asyncio.ensure_future(client.get(sc.url + "/a"))
        await upstream.wait_in_flight(1)
        async with client.get(sc.url + "/b") as r:
            assert r.status == 503
            assert r.headers["Retry-After"] == "2"  # max_wait: the time the queue that refused it turns over
            assert "concurrency limit" in await r.text()
        # The engine decided: the refusal is an overloaded outcome, retried up to max_attempts (3).
        assert sc.metric("sidecar_admission_rejected_total", reason="queue-full") == 3
        assert sc.metric("sidecar_retries_total", outcome="overloaded") == 2
        writing = asyncio.ensure_future(client.post(sc.url + "/w", data=b"x"))
        await upstream.wait_in_flight(2)  # the write pool has its own ticket
        upstream.hold.set()
        for call in (holding, writing):
            async with await call as r:
                assert r.status == 200
        assert upstream.hits == 2


async def test_a_wait_longer_than_max_wait_is_refused(client, upstream) -> None:
    upstream.hold = asyncio.Event()
    async with sidecar(
        limited([upstream.endpoint], {"mode": "fixed", "initial": 2, "max_wait": "50ms"}, {"max_attempts": 1})
    ) as sc:
        holding = asyncio.ensure_future(client.get(sc.url + "/a"))
        await upstream.wait_in_flight(1)
        async with client.get(sc.url + "/b") as r:
            assert r.status == 503
        assert sc.metric("sidecar_admission_rejected_total", reason="max-wait") == 1
        assert sc.metric("sidecar_admission_added_to_queue_total") == 1
        upstream.hold.set()
        async with await holding as r:
            assert r.status == 200


async def test_probing_raises_the_limit_while_tickets_are_exhausted(client) -> None:
    async with (
        FaultyUpstream(hold=asyncio.Event()) as up,
        sidecar(
            limited(
                [up.endpoint],
                {"mode": "probing", "initial": 4, "min": 2, "max": 64, "interval": "20ms", "max_wait": "60s"},
            )
        ) as sc,
    ):
        assert up.hold is not None
        calls = [asyncio.ensure_future(client.get(f"{sc.url}/{i}")) for i in range(40)]
        await up.wait_in_flight(2)
        # Exhausted (everyone queued) and below max: the prober probes up; the larger limit wakes waiters.
        await until(lambda: up.in_flight > 2, "a waiter woken by a larger limit")
        assert sc.metric("sidecar_concurrency_limit") > 4
        up.hold.set()
        for c in calls:
            async with await c as r:
                assert r.status == 200
        assert sc.metric("sidecar_concurrency_in_use") == 0


async def test_without_a_concurrency_block_nothing_is_limited(client) -> None:
    async with FaultyUpstream(hold=asyncio.Event()) as up, sidecar(config([up.endpoint])) as sc:
        assert up.hold is not None
        calls = [asyncio.ensure_future(client.get(f"{sc.url}/{i}")) for i in range(10)]
        await up.wait_in_flight(10)
        up.hold.set()
        for c in calls:
            async with await c as r:
                assert r.status == 200
        assert sc.metric("sidecar_concurrency_limit") == 0


async def test_a_reload_changes_the_limits_and_keeps_the_waiters(client) -> None:
    from sidecar.config import load_dict

    cc = {"mode": "fixed", "initial": 2, "max_wait": "60s"}
    async with FaultyUpstream(hold=asyncio.Event()) as up, sidecar(limited([up.endpoint], cc)) as sc:
        assert up.hold is not None
        calls = [asyncio.ensure_future(client.get(f"{sc.url}/{i}")) for i in range(4)]
        await up.wait_in_flight(1)
        await until(lambda: sc.metric("sidecar_concurrency_queued", pool="read") == 3, "three waiters")
        bigger = limited([up.endpoint], {**cc, "initial": 6})  # three read tickets
        assert sc.app.apply(load_dict(bigger, {}))
        await up.wait_in_flight(3)  # two waiters granted by the larger limit, at once
        assert sc.metric("sidecar_concurrency_queued", pool="read") == 1
        assert sc.metric("sidecar_concurrency_limit", pool="read") == 3
        up.hold.set()
        for c in calls:
            async with await c as r:
                assert r.status == 200
        assert up.peak_in_flight == 3 and up.hits == 4
        assert sc.metric("sidecar_admission_interrupted_in_queue_total") == 0


async def test_exempt_paths_take_no_ticket(client, upstream) -> None:
    upstream.hold = asyncio.Event()
    cfg = limited([upstream.endpoint], {"mode": "fixed", "initial": 2, "max_queue": 0}, {"max_attempts": 1})
    cfg["admission"] = {"front": {"requests": {"rate": 1000}}}
    cfg["listeners"][0].update(admission="front", exempt_paths=["/health"])
    async with sidecar(cfg) as sc:
        holding = asyncio.ensure_future(client.get(sc.url + "/a"))  # the one read ticket
        await upstream.wait_in_flight(1)
        async with client.get(sc.url + "/b") as r:
            assert r.status == 503
        health = asyncio.ensure_future(client.get(sc.url + "/health?deep=1"))  # exempt: straight through
        await upstream.wait_in_flight(2)
        upstream.hold.set()
        for call in (holding, health):
            async with await call as r:
                assert r.status == 200
        assert sc.metric("sidecar_admission_exempted_total", limiter="concurrency") == 1


async def test_the_wait_for_a_ticket_comes_out_of_the_deadline_sent_upstream(client, upstream) -> None:
    upstream.then(Fault(200, delay=0.4, body=b"slow"))  # the first holds the one read ticket for 400 ms
    async with sidecar(
        limited([upstream.endpoint], {"mode": "fixed", "initial": 2, "max_wait": "60s"})
    ) as sc:
        headers = {"X-YaTaxi-Client-TimeoutMs": "5000"}
        first = asyncio.ensure_future(client.get(sc.url + "/a", headers=headers))
        await upstream.wait_in_flight(1)
        async with client.get(sc.url + "/b", headers=headers) as r:
            assert r.status == 200
        async with await first as r:
            assert r.status == 200
        a, b = upstream.received
        assert a.timeout_ms is not None and b.timeout_ms is not None
        waited_ms = (b.at - a.at) * 1000
        assert waited_ms >= 300  # it waited for the ticket ...
        assert b.timeout_ms <= 5000 - waited_ms + 50  # ... and the upstream is told what is left
