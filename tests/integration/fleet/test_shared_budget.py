"""Three sidecars (in-process Apps, one event loop) share one upstream's retry budget through a real
redis-server during a full outage of a real upstream; the same fleet with local budgets as the control."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.testing.http_upstream import FaultyUpstream
from sidecar.testing.redis_server import RedisServer
from tests.integration.fleet.fleet_sidecars import drive, fleet, fleet_config, link, new_prefix, url
from tests.metrics import metric

RATIO, FLOOR, SIDECARS, REQUESTS = 0.05, 20.0, 3, 1200


async def outage(redis: RedisServer, scope: str, sidecars: int = SIDECARS) -> tuple[int, float]:
    """Retries the upstream saw while every attempt fails, and the seconds the fleet's budget existed."""
    loop = asyncio.get_running_loop()
    async with FaultyUpstream(fail_rate=1.0, keep_records=True) as up:
        cfg = fleet_config(
            up.endpoint,
            redis.url,
            new_prefix(),
            scope=scope,
            ratio=RATIO,
            min_per_second=FLOOR,
            fallback_members=sidecars,
            timeout="1s",  # sharing is under test here, not outages: no settle may miss its timeout
        )
        born = loop.time()
        async with fleet(cfg, sidecars) as apps:
            if scope == "fleet":
                for app in apps:
                    await link(app).wait_for(lambda m: m.up == 1 and m.members == sidecars)
            results = await drive([url(a) for a in apps], REQUESTS)
            lived = loop.time() - born
            assert [s for s, _ in results] == [503] * REQUESTS
            if scope == "fleet":
                assert sum(metric(a, "sidecar_fleet_redis_up") for a in apps) == sidecars
            refused = sum(metric(a, "sidecar_retry_budget_throttled_total", scope=scope) for a in apps)
        retries = sum(1 for seen in up.received if (seen.attempt or 1) > 1)
        assert len(up.received) == REQUESTS + retries
        assert refused > 0  # the budget, not max_attempts, is what stopped the retries
        return retries, lived


@pytest.mark.parametrize("sidecars", [3, 10])
async def test_fleet_retries_stay_within_ratio_times_requests_plus_one_floor(redis_session, sidecars):
    retries, lived = await outage(redis_session, "fleet", sidecars)
    # the fleet's ratio part, the fleet floor's refill while it existed, and its capacity twice: the Redis
    # bucket starts full, and so did each sidecar's share of it (1/3 each) before its first settle
    bound = RATIO * REQUESTS + FLOOR * lived + 2 * FLOOR
    assert retries <= bound, f"{retries} retries in {lived:.2f}s, bound {bound:.1f}"
    # and the budget is not simply closed (requests deposit at the next settle: the last lease or two of
    # deposits come too late for a short outage)
    assert retries >= 0.5 * RATIO * REQUESTS


async def test_local_budgets_give_each_sidecar_a_floor_of_its_own(redis_session):
    retries, lived = await outage(redis_session, "local")
    # the control: each of the three sidecars spends a whole floor, so the fleet's bound is broken
    assert retries > RATIO * REQUESTS + FLOOR * lived + 2 * FLOOR
    assert retries <= RATIO * REQUESTS + SIDECARS * FLOOR * (lived + 1)
