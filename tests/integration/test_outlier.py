"""Outlier detection end to end: a real aiohttp client -> the sidecar -> two real HTTP upstreams, one of
which stops listening (its socket closed: connections refused) and later comes back on the same port."""

from __future__ import annotations

import asyncio
import random

import aiohttp

from sidecar.testing.http_upstream import FaultyUpstream
from tests.integration.http.conftest import config, sidecar

#: Short ejections so that the return is seen quickly; the retry budget is the preset's (A6, 10 tokens).
OUTLIERS = {"consecutive_connect_failures": 3, "base_ejection_time": "200ms", "max_ejection_time": "1s"}


async def _get(client: aiohttp.ClientSession, url: str) -> int:
    try:
        async with client.get(url + "/x") as r:
            await r.read()
            return r.status
    except aiohttp.ClientError:
        return 0


async def test_a_dead_endpoint_leaves_the_rotation_and_comes_back() -> None:
    async with FaultyUpstream() as a, FaultyUpstream() as b:
        cfg = config([a.endpoint, b.endpoint])
        cfg["upstreams"]["api"]["outlier_detection"] = OUTLIERS
        async with (
            sidecar(cfg, rand=random.Random(1).random) as sc,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as client,
        ):
            for _ in range(20):
                assert await _get(client, sc.url) == 200
            assert a.hits and b.hits  # both in rotation

            port = b.port
            await b.stop()  # connections to it are refused from now on
            statuses = []
            for _ in range(20):  # ten at a time, as an app with concurrent requests would
                statuses += await asyncio.gather(*(_get(client, sc.url) for _ in range(10)))
            ok = sum(s == 200 for s in statuses)
            assert ok / len(statuses) >= 0.99, statuses
            # the retries that saved the first requests cost nothing from the retry budget
            assert sc.metric("sidecar_throttled_total") == 0
            assert sc.metric("sidecar_ejections_total", reason="consecutive-connect-failures") >= 1
            # each ejection is followed by one probe per ejection time: a few connect failures, not 50 %
            failures = sc.metric("sidecar_attempts_total", outcome="connect-failure")
            assert failures <= 30, failures
            assert sc.metric("sidecar_endpoint_ejected", endpoint=f"127.0.0.1:{port}") == 1.0
            assert sc.metric("sidecar_endpoint_ejected", endpoint=a.endpoint) == 0.0

            await b.start(port)  # back on the same address
            before = b.hits
            async with asyncio.timeout(15):  # the next probe returns it: requests reach it again
                while b.hits < before + 5:
                    assert await _get(client, sc.url) == 200
            assert sc.metric("sidecar_endpoint_ejected", endpoint=f"127.0.0.1:{port}") == 0.0
