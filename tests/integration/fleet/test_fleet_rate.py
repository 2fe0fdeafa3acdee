"""A fleet-wide request rate (admission ``requests.scope: fleet``, issue 15): two sidecars (in-process Apps)
share one rate through a real redis-server, under skewed load from real aiohttp clients: the fleet admits
about its rate, not twice it, and the busy sidecar gets most of it."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from sidecar.config import ConfigError, load_dict
from sidecar.testing.http_upstream import FaultyUpstream
from sidecar.testing.redis_server import RedisServer
from tests.integration.fleet.fleet_sidecars import fleet, fleet_config, link, new_prefix, url
from tests.metrics import metric

RATE, SECONDS = 20.0, 2.0


def rate_config(endpoint: str, redis_url: str, prefix: str) -> dict[str, Any]:
    cfg = fleet_config(endpoint, redis_url, prefix, fallback_members=2, timeout="1s")
    del cfg["upstreams"]["api"]["retry_budget"]
    cfg["admission"] = {"front": {"requests": {"rate": RATE, "burst": "1s", "scope": "fleet"}}}
    cfg["listeners"][0]["admission"] = "front"
    return cfg


async def load(session: aiohttp.ClientSession, target: str, workers: int, until: float) -> tuple[int, int]:
    """``workers`` clients sending GETs back to back until loop time ``until``: (admitted, refused)."""
    loop = asyncio.get_running_loop()
    counts = [0, 0]

    async def worker() -> None:
        while loop.time() < until:
            async with session.get(target) as resp:
                await resp.read()
                counts[0 if resp.status == 200 else 1] += 1
                assert resp.status in (200, 429)

    await asyncio.gather(*(worker() for _ in range(workers)))
    return counts[0], counts[1]


async def test_a_fleet_rate_is_shared_by_demand_and_holds_for_the_whole_fleet(redis_session: RedisServer) -> None:
    loop = asyncio.get_running_loop()
    async with FaultyUpstream(keep_records=False) as up:
        cfg = rate_config(up.endpoint, redis_session.url, new_prefix())
        async with fleet(cfg, 2) as (busy, quiet):
            for app in (busy, quiet):
                await link(app).wait_for(lambda m: m.up == 1 and m.members == 2)
            async with aiohttp.ClientSession() as session:

                async def run(seconds: float) -> tuple[tuple[int, int], tuple[int, int], float]:
                    """4 clients on one sidecar, 1 on the other, over the rate all along."""
                    began = loop.time()
                    a, b = await asyncio.gather(
                        load(session, url(busy), 4, began + seconds), load(session, url(quiet), 1, began + seconds)
                    )
                    return a, b, loop.time() - began

                (busy_ok, busy_no), (quiet_ok, quiet_no), elapsed = await run(SECONDS)
                assert busy_no > 0 and quiet_no > 0  # both were over the rate all along
                admitted = busy_ok + quiet_ok
                # the fleet's rate over the run, plus the burst banked before it (each sidecar its share of
                # it, one token at least), and a lease period of drift between the shares
                assert admitted <= RATE * elapsed + RATE + 2 + RATE * 0.1, (admitted, elapsed)
                # the banks are spent now: the next run is the fleet's rate alone, shared by demand (4 to 1)
                (busy_ok, _), (quiet_ok, _), elapsed = await run(SECONDS)
            admitted = busy_ok + quiet_ok
            assert abs(admitted - RATE * elapsed) <= 0.2 * RATE * elapsed + 2, (admitted, elapsed)
            assert busy_ok >= 0.6 * admitted, (busy_ok, quiet_ok)
            shares = [link(a).member.share_by_name()["admission:web"] for a in (busy, quiet)]
            assert sum(shares) == pytest.approx(1.0, abs=0.1) and shares[0] > shares[1]
            # and the gauge says whose share it is: the listener's request rate
            assert metric(busy, "sidecar_fleet_share", listener="web", limiter="requests") == shares[0]


def test_scope_fleet_needs_a_fleet_block_and_a_change_needs_a_restart() -> None:
    cfg = rate_config("127.0.0.1:1", "redis://127.0.0.1:1/0", "p:")
    del cfg["fleet"]
    with pytest.raises(ConfigError) as e:
        load_dict(cfg, {})
    assert ("admission.front.requests.scope", "scope fleet needs a `fleet:` block") in e.value.errors
    from sidecar.reload import restart_reasons

    old = load_dict(rate_config("127.0.0.1:1", "redis://127.0.0.1:1/0", "p:"), {})
    changed = rate_config("127.0.0.1:1", "redis://127.0.0.1:1/0", "p:")
    changed["admission"]["front"]["requests"]["rate"] = 40
    assert restart_reasons(old, load_dict(changed, {})) == [
        "listeners.web.admission: its request rate is leased fleet-wide; changing it needs a restart"
    ]
