"""Retries end to end: which answers are retried, how often, to where, and what the client finally gets."""

from __future__ import annotations

import asyncio

from sidecar.policy import Reason
from sidecar.testing.http_upstream import Fault, FaultyUpstream

from .conftest import config, sidecar, unused_port


async def test_503_twice_then_200_is_one_answer_from_three_hits(client, upstream) -> None:
    upstream.fail_next(2, 503)
    async with sidecar(config([upstream.endpoint])) as sc:
        async with client.get(sc.url + "/orders/1?x=1") as r:
            assert r.status == 200 and await r.text() == "ok\n"
        assert upstream.hits == 3
        assert [s.attempt for s in upstream.received] == [1, 2, 3]
        assert all(s.path == "/orders/1" for s in upstream.received)
        assert sc.metric("sidecar_retries_total", outcome="overloaded") == 2
        assert sc.requests(Reason.SUCCESS) == 1


async def test_retries_exhausted_gives_the_last_upstream_answer_unchanged(client, upstream) -> None:
    upstream.then(
        Fault(502, body=b"first"),
        Fault(504, body=b"second"),
        Fault(503, body=b"third", headers=(("X-Upstream", "3"),)),
    )
    async with sidecar(config([upstream.endpoint])) as sc:
        async with client.get(sc.url + "/") as r:
            assert r.status == 503
            assert await r.read() == b"third" and r.headers["X-Upstream"] == "3"
        assert upstream.hits == 3
        assert sc.requests(Reason.ATTEMPTS_EXHAUSTED) == 1


async def test_other_statuses_are_final_and_passed_through(client, upstream) -> None:
    upstream.then(Fault(500, body=b"boom"), Fault(404, body=b"nope"))
    async with sidecar(config([upstream.endpoint])) as sc:
        async with client.get(sc.url + "/") as r:
            assert r.status == 500 and await r.read() == b"boom"
        async with client.get(sc.url + "/") as r:
            assert r.status == 404 and await r.read() == b"nope"
        assert upstream.hits == 2


async def test_post_is_not_retried_on_503(client, upstream) -> None:
    upstream.fail_next(1, 503)
    async with sidecar(config([upstream.endpoint])) as sc:
        async with client.post(sc.url + "/pay", data=b"{}") as r:
            assert r.status == 503
        assert upstream.hits == 1
        assert sc.requests(Reason.NOT_RETRYABLE) == 1


async def test_post_is_retried_after_a_connect_failure(client, upstream) -> None:
    dead = f"127.0.0.1:{unused_port()}"
    async with sidecar(config([dead, upstream.endpoint])) as sc:  # rand 0: the dead one is picked first
        async with client.post(sc.url + "/pay", data=b'{"amount": 1}') as r:
            assert r.status == 200
        assert upstream.hits == 1 and upstream.received[0].attempt == 2
        assert upstream.received[0].body_len == len(b'{"amount": 1}')
        assert sc.metric("sidecar_attempts_total", outcome="connect-failure") == 1


async def test_route_may_allow_retrying_non_idempotent_methods(client, upstream) -> None:
    upstream.fail_next(1, 503)
    cfg = config(
        [upstream.endpoint],
        listener={"routes": [{"match": {"path_prefix": "/jobs"}, "retry_non_idempotent": True}]},
    )
    async with sidecar(cfg) as sc:
        async with client.post(sc.url + "/jobs/1", data=b"x") as r:
            assert r.status == 200
        assert upstream.hits == 2 and upstream.received[1].body_len == 1


async def test_no_upstream_reachable_is_502_naming_the_reason(client) -> None:
    cfg = config([f"127.0.0.1:{unused_port()}"])
    async with sidecar(cfg) as sc, client.get(sc.url + "/") as r:
        assert r.status == 502
        assert "connect failure after 3 attempts" in await r.text()


async def test_a_reset_before_the_response_is_retried(client, upstream) -> None:
    upstream.then(Fault(reset=True))
    async with sidecar(config([upstream.endpoint])) as sc:
        async with client.get(sc.url + "/") as r:
            assert r.status == 200
        assert upstream.hits == 2
        assert sc.metric("sidecar_attempts_total", outcome="reset") == 1


async def test_retry_after_is_honoured(client, upstream) -> None:
    upstream.fail_next(1, 503, retry_after="1")
    async with sidecar(config([upstream.endpoint])) as sc, client.get(sc.url + "/") as r:
        assert r.status == 200
    first, second = upstream.received
    assert second.at - first.at >= 1.0  # the upstream saw the gap it asked for


async def test_pushback_header_in_milliseconds_and_minus_one_stops(client, upstream) -> None:
    upstream.then(Fault(429, headers=(("x-retry-after-ms", "-1"),)))
    async with sidecar(config([upstream.endpoint], {"pushback_header": "x-retry-after-ms"})) as sc:
        async with client.get(sc.url + "/") as r:
            assert r.status == 429
        assert upstream.hits == 1
        assert sc.requests(Reason.PUSHBACK_NO_RETRY) == 1


async def test_retry_after_beyond_the_deadline_ends_at_once_with_498(client, upstream) -> None:
    upstream.fail_next(1, 503, retry_after="30")
    async with sidecar(config([upstream.endpoint])) as sc:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        async with client.get(sc.url + "/", headers={"X-YaTaxi-Client-TimeoutMs": "5000"}) as r:
            assert r.status == 498
            assert await r.text() == "Deadline expired"
            assert r.headers["X-YaTaxi-Deadline-Expired"] == "1"
        assert loop.time() - t0 < 4.0  # well before the 5 s deadline: no waiting it out
        assert upstream.hits == 1
        assert sc.requests(Reason.DEADLINE) == 1


async def test_throttle_stops_retries_after_a_failure_streak_and_recovers(client) -> None:
    policy = {"throttle": {"kind": "grpc", "max_tokens": 4, "token_ratio": 1}}
    async with FaultyUpstream(fail_rate=1.0) as up, sidecar(config([up.endpoint], policy)) as sc:
        # tokens 4 (retries while > 2): a failure -> 3, retry; a failure -> 2: throttled.
        async with client.get(sc.url + "/") as r:
            assert r.status == 503
        assert up.hits == 2
        async with client.get(sc.url + "/") as r:  # 2 -> 1: not retried at all
            assert r.status == 503
        assert up.hits == 3
        assert sc.metric("sidecar_throttled_total") == 2
        up.fail_rate = 0.0
        for _ in range(3):  # successes earn tokens back: 1 -> 4
            async with client.get(sc.url + "/") as r:
                assert r.status == 200
        up.fail_next(1, 503)
        async with client.get(sc.url + "/") as r:  # 4 -> 3: retried again
            assert r.status == 200
        assert up.hits == 8
        assert sc.metric("sidecar_throttled_total") == 2


async def test_an_overloaded_endpoint_is_avoided_by_the_retry_and_by_later_requests(client) -> None:
    async with (
        FaultyUpstream(fail_rate=1.0, fail=Fault(429)) as busy,
        FaultyUpstream() as calm,
        sidecar(config([busy.endpoint, calm.endpoint])) as sc,  # rand 0: the busy one is picked first
    ):
        async with client.get(sc.url + "/") as r:
            assert r.status == 200
        assert busy.hits == 1 and calm.hits == 1
        for _ in range(3):  # in its overload cooldown: nobody is sent there
            async with client.get(sc.url + "/") as r:
                assert r.status == 200
        assert busy.hits == 1 and calm.hits == 4
