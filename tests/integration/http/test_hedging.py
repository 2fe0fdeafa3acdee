"""Hedging over HTTP: copies to distinct endpoints, the first good answer wins, the others are cancelled."""

from __future__ import annotations

import asyncio

from sidecar.testing.http_upstream import Fault, FaultyUpstream

from .conftest import config, sidecar

HEDGE = {"hedging": {"max_attempts": 2, "delay": "50ms"}, "per_try_timeout": "10s"}


async def test_hedging_cuts_a_slow_endpoint_and_cancels_the_loser(client) -> None:
    loop = asyncio.get_running_loop()
    async with (
        FaultyUpstream() as slow,
        FaultyUpstream() as fast,
        sidecar(config([slow.endpoint, fast.endpoint], HEDGE)) as sc,  # rand 0: the slow one first
    ):
        slow.then(Fault(200, delay=8.0, body=b"slow"))
        t0 = loop.time()
        async with client.get(sc.url + "/") as r:
            assert r.status == 200 and await r.text() == "ok\n"
        assert loop.time() - t0 < 4.0  # far less than the slow endpoint's 8 s
        await slow.wait_cancelled(1)  # the loser was abandoned, its connection closed
        assert slow.received[0].attempt == 1 and fast.received[0].attempt == 2
        assert sc.metric("sidecar_hedges_total") == 1


async def test_a_non_fatal_answer_sends_the_next_hedge_at_once(client) -> None:
    slow_hedge = {"hedging": {"max_attempts": 2, "delay": "30s"}, "per_try_timeout": "10s"}
    async with (
        FaultyUpstream() as bad,
        FaultyUpstream() as good,
        sidecar(config([bad.endpoint, good.endpoint], slow_hedge)) as sc,
    ):
        bad.fail_next(1, 503)
        async with client.get(sc.url + "/") as r:  # no 30 s wait: the 503 sent the hedge
            assert r.status == 200
        assert bad.hits == 1 and good.hits == 1


async def test_non_idempotent_requests_are_not_hedged(client) -> None:
    async with (
        FaultyUpstream() as slow,
        FaultyUpstream() as fast,
        sidecar(config([slow.endpoint, fast.endpoint], HEDGE)) as sc,
    ):
        slow.then(Fault(201, delay=0.3, body=b"created"))
        async with client.post(sc.url + "/orders", data=b"{}") as r:
            assert r.status == 201 and await r.read() == b"created"
        assert fast.hits == 0
        assert sc.metric("sidecar_hedges_total") == 0


async def test_hedged_upload_replays_the_body_to_each_copy(client) -> None:
    async with (
        FaultyUpstream() as slow,
        FaultyUpstream() as fast,
        sidecar(config([slow.endpoint, fast.endpoint], HEDGE)) as sc,
    ):
        slow.then(Fault(200, delay=8.0))
        body = b"p" * 200_000
        async with client.put(sc.url + "/doc", data=body) as r:
            assert r.status == 200
        await slow.wait_cancelled(1)
        assert fast.received[0].body_len == len(body)
