"""The settle script against a real redis-server: shares by demand, Redis's own clock, members' liveness."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from sidecar.fleet import SETTLE, keys
from sidecar.testing.redis_server import RedisServer

_prefixes = itertools.count()
TTL, EXPIRE = 1.0, 60.0
#            ratio rate capacity window
SPEC = [0.5, 10, 10, 10]


@pytest.fixture
async def r(redis_session: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_session.url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
def ks() -> list[str]:
    return keys(f"test-script-{next(_prefixes)}:", ["orders"])


async def settle(r, ks, member, events=0, returned=0.0, demand=0.0, spec=SPEC):  # noqa: ANN001, ANN201
    reply = await r.eval(SETTLE, len(ks), *ks, member, TTL, 1, EXPIRE, *spec, events, returned, demand)
    return int(reply[0]), float(reply[1]), float(reply[2])


async def test_shares_follow_demand(r, ks):
    await settle(r, ks, "a", demand=8)
    await settle(r, ks, "b", demand=2)
    _, _, share_a = await settle(r, ks, "a", demand=8)
    members, _, share_b = await settle(r, ks, "b", demand=2)
    assert members == 2
    assert share_a == pytest.approx(0.8, abs=0.01) and share_b == pytest.approx(0.2, abs=0.01)


async def test_grants_never_exceed_what_the_fleet_has(r, ks):
    # floor 10 (full), plus 0.5 x 40 requests: two members asking for everything get 30 between them
    total = 0.0
    for i in range(10):
        for m in ("a", "b"):
            _, grant, _ = await settle(r, ks, m, events=20 if i == 0 else 0, demand=100)
            total += grant
    assert 29.0 < total <= 30.0 + 10 * 1.0  # at most the floor's refill during the settles on top


async def test_the_floor_refills_on_redis_time(r, ks):
    spec = [0.0, 10, 10, 10]
    _, grant, _ = await settle(r, ks, "a", demand=1, spec=spec)
    assert grant == pytest.approx(10, abs=0.5)  # full floor, all of it to the only member
    _, grant, _ = await settle(r, ks, "a", demand=1, spec=spec)
    assert grant < 1  # nothing left but what refilled in a few ms
    (now_s, now_us) = await r.time()
    await r.hset(ks[1], "at", now_s + now_us / 1e6 - 0.5)  # as if the last settle was half a second ago
    _, grant, _ = await settle(r, ks, "a", demand=1, spec=spec)
    assert grant == pytest.approx(5, abs=0.5)  # 10/s x 0.5 s, timed by Redis, not by the caller


async def test_returned_tokens_go_back_to_the_pool(r, ks):
    spec = [0.0, 0, 10, 10]  # a floor that never refills: only what is returned comes back
    _, grant, _ = await settle(r, ks, "a", demand=1, spec=spec)
    assert grant == pytest.approx(10)
    _, grant, _ = await settle(r, ks, "a", returned=4, demand=1, spec=spec)
    assert grant == pytest.approx(4)


async def test_a_member_not_seen_for_ttl_is_dropped_with_its_demand(r, ks):
    await settle(r, ks, "gone", demand=100)
    (now_s, _) = await r.time()
    await r.zadd(ks[0], {"gone": now_s - 10})  # last seen 10 s ago (ttl 1 s)
    members, _, share = await settle(r, ks, "a", demand=1)
    assert members == 1 and share == pytest.approx(1.0)
    assert await r.hkeys(ks[2]) == ["a"]


async def test_keys_expire_when_the_fleet_is_gone(r, ks):
    await settle(r, ks, "a", events=5, demand=1)
    for k in ks:
        assert 0 < await r.pttl(k) <= EXPIRE * 1000
