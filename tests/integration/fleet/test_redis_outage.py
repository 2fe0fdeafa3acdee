"""Redis stopped (SIGSTOP), killed, restarted empty, or never there: requests keep flowing on a local share,
nothing waits longer than ``fleet.redis.timeout``, and the fleet shares the budget again when Redis returns."""

from __future__ import annotations

import logging

import pytest

from sidecar.testing.http_upstream import FaultyUpstream
from sidecar.testing.redis_server import RedisServer, free_port
from tests.integration.fleet.fleet_sidecars import drive, fleet, fleet_config, link, new_prefix, url
from tests.metrics import metric

TIMEOUT = 0.05
#: A request never waits for Redis; this bound only has to be far above any request's time on a loaded
#: machine while far below what waiting on a stopped Redis would cost (forever).
SLOW = 2.0
FLOOR = 100.0


def down(m) -> bool:  # noqa: ANN001
    return m.up == 0 and m.failures > 0


def up_with(n: int):  # noqa: ANN201
    return lambda m: m.up == 1 and m.members == n


async def flows(apps, n: int = 60) -> None:  # noqa: ANN001
    """Requests are answered (a few may be the upstream's 503 when all three attempts fail: 1 in 1,000)."""
    results = await drive([url(a) for a in apps], n)
    assert len(results) == n
    assert {status for status, _ in results} <= {200, 503}
    assert sum(status == 200 for status, _ in results) >= 0.9 * n
    assert max(t for _, t in results) < SLOW


async def test_stopped_then_killed_redis_falls_back_and_rejoins(redis_own: RedisServer):
    async with FaultyUpstream(fail_rate=0.1) as up:
        cfg = fleet_config(up.endpoint, redis_own.url, new_prefix(), min_per_second=FLOOR, timeout="50ms")
        async with fleet(cfg, 2) as apps:
            links = [link(a) for a in apps]
            budgets = [lk.member.shares[0].budget for lk in links]  # type: ignore[attr-defined]
            for lk, b in zip(links, budgets, strict=True):
                await lk.wait_for(up_with(2))
                assert b.leased

            redis_own.pause()  # SIGSTOP: connections stay open, nothing answers
            for lk in links:
                await lk.wait_for(down)
            # each stands alone as one of the two members it last saw
            assert all(not b.leased and b.capacity == FLOOR / 2 for b in budgets)
            assert all(metric(a, "sidecar_fleet_redis_up") == 0 for a in apps)
            await flows(apps)
            for lk in links:  # no settle waited longer than the timeout (+ the loop's own delays)
                assert lk.member.latency.sum <= (lk.member.settles + lk.member.failures) * (TIMEOUT + 0.5)

            redis_own.resume()
            for lk, b in zip(links, budgets, strict=True):
                await lk.wait_for(up_with(2))
                assert b.leased

            redis_own.kill()
            for lk in links:
                await lk.wait_for(down)
            await flows(apps)
            restarted = RedisServer(port=redis_own.port).start()  # empty: no script, no pools, no members
            try:
                for lk, b in zip(links, budgets, strict=True):
                    await lk.wait_for(up_with(2))
                    assert b.leased  # checked at the settle itself: a later one may miss the timeout
                await flows(apps)
            finally:
                restarted.kill()


async def test_starts_without_redis_on_a_share_of_fallback_members(redis_binary, caplog):
    caplog.set_level(logging.INFO, logger="sidecar.fleet")
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    async with FaultyUpstream(fail_rate=0.1) as up:
        cfg = fleet_config(up.endpoint, nowhere, new_prefix(), min_per_second=FLOOR, fallback_members=4)
        async with fleet(cfg, 1) as (app,):
            lk = link(app)
            await lk.wait_for(lambda m: m.failures >= 3)
            budget = lk.member.shares[0].budget  # type: ignore[attr-defined]
            assert not budget.leased and budget.capacity == pytest.approx(FLOOR / 4)
            assert metric(app, "sidecar_fleet_members") == 4
            await flows([app])
    unreachable = [r for r in caplog.records if "Redis unreachable" in r.getMessage()]
    assert len(unreachable) == 1  # said once, not once per lease
