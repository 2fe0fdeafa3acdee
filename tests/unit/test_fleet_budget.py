"""The ratio retry budget (``upstreams.<name>.retry_budget``): the pure ``RetryBudget`` and its composition
with a policy's own throttle, driven through the engine on a hand-moved clock."""

from __future__ import annotations

import pytest

from sidecar.policy import (
    BudgetedThrottle,
    Finish,
    Reason,
    RetryBudget,
    RetryPolicy,
    ThrottleKind,
    ThrottleSpec,
    make_throttle,
)
from tests.unit.playbook import OK, UNAVAILABLE, make_call, run

R = Reason
NO_BACKOFF = RetryPolicy(backoff_on=frozenset())


def test_floor_alone_allows_capacity_then_refills_at_min_per_second():
    b = RetryBudget(ratio=0.2, min_per_second=10, window=10, now=0.0)
    assert sum(b.acquire(0.0) for _ in range(15)) == 10  # capacity = min_per_second
    assert not b.acquire(0.05)  # half a token refilled
    assert b.acquire(0.1)  # one token after 0.1 s
    assert sum(b.acquire(100.0) for _ in range(15)) == 10  # never more than the capacity


def test_requests_deposit_ratio_on_top_of_the_floor():
    b = RetryBudget(ratio=0.2, min_per_second=0, window=10, now=0.0)
    for _ in range(100):
        b.on_request(1.0)
    assert sum(b.acquire(1.0) for _ in range(30)) == 20  # 0.2 x 100
    assert b.refused == 10 and b.wanted == 30 and b.granted == 20


def test_the_ratio_part_forgets_requests_older_than_the_window():
    b = RetryBudget(ratio=0.5, min_per_second=0, window=1.0, now=0.0)
    for _ in range(100):
        b.on_request(0.0)
    b.advance(0.0)
    assert b.pool == pytest.approx(50)
    b.advance(5.0)  # five windows later: e^-5 of the requests still count
    assert b.pool == pytest.approx(50 * 2.718281828**-5, rel=1e-6)


def test_retries_over_an_outage_stay_within_ratio_times_requests_plus_floor():
    b = RetryBudget(ratio=0.2, min_per_second=10, window=10, now=0.0)
    retries = requests = 0
    t = 0.0
    for _ in range(60_000):  # 60 s at 1,000 requests/s, every request wanting two retries
        t += 0.001
        b.on_request(t)
        requests += 1
        retries += b.acquire(t) + b.acquire(t)
    assert retries <= 0.2 * requests + 10 * 60 + 10
    assert retries >= 0.2 * requests * 0.95  # and it does allow about that much


def test_leased_budget_spends_only_its_lease_and_keeps_counting():
    b = RetryBudget(ratio=0.2, min_per_second=10, window=10, now=0.0)
    b.lease_granted(2.5)
    for _ in range(50):
        b.on_request(1.0)
    assert [b.acquire(1.0) for _ in range(4)] == [True, True, False, False]
    assert b.requests == 50 and b.wanted == 4
    b.stand_alone(min_per_second=2.0)  # alone again: what is left of the lease, then 2/s of floor
    assert not b.leased and b.capacity == 2.0 and b.floor == 0.5 and b.pool == 0.0
    assert not b.acquire(1.0)  # the 50 requests' deposits went to the fleet: not spent twice
    for _ in range(50):
        b.on_request(2.0)
    assert sum(b.acquire(2.0) for _ in range(20)) == 10 + 2  # 0.2 x 50 new requests + a full floor of 2


def test_composite_needs_both_and_a_refusal_takes_nothing_from_the_other():
    mongo = make_throttle(ThrottleSpec(ThrottleKind.MONGODB, capacity=5))
    budget = RetryBudget(ratio=0.0, min_per_second=2, window=10, now=0.0)
    both = BudgetedThrottle(mongo, budget)
    assert [both.acquire(0.0) for _ in range(3)] == [True, True, False]
    assert mongo.tokens == 3  # the budget's refusal did not spend a MongoDB token
    budget.lease_granted(10.0)
    mongo.tokens = 0.5
    assert not both.acquire(0.0)
    assert budget.lease == 10.0  # the policy's refusal did not spend the budget


def test_engine_counts_first_attempts_only_and_gives_up_throttled():
    budget = RetryBudget(ratio=0.6, min_per_second=0, window=1000, now=0.0)
    inner = make_throttle(ThrottleSpec(ThrottleKind.GRPC, max_tokens=10, token_ratio=0.1))
    throttle = BudgetedThrottle(inner, budget)
    # request 1: one failure, the retry succeeds -> 1 request counted, 0.6 token deposited: not enough
    d = run(make_call(NO_BACKOFF, throttle=throttle), [UNAVAILABLE, OK])
    assert d.finish.reason is R.THROTTLED and budget.requests == 1
    # request 2: now 1.2 tokens: its retry goes, and the retry is not counted as a request
    d = run(make_call(NO_BACKOFF, throttle=throttle), [UNAVAILABLE, OK], now=1.0)
    assert d.finish.reason is R.SUCCESS and len(d.sends) == 2
    assert budget.requests == 2 and budget.granted == 1


def test_budget_without_a_policy_throttle_is_the_throttle():
    budget = RetryBudget(ratio=0.0, min_per_second=1, window=10, now=0.0)
    policy = RetryPolicy(throttle=None, backoff_on=frozenset())
    d = run(make_call(policy, throttle=budget), [UNAVAILABLE, OK])
    assert d.finish.reason is R.SUCCESS  # the floor's one token
    d = run(make_call(policy, throttle=budget), [UNAVAILABLE, OK])
    assert d.finish == Finish(R.THROTTLED, 1, UNAVAILABLE, 1)
    assert (budget.requests, budget.granted, budget.refused) == (2, 1, 1)
