"""A fleet member's accounting without Redis: what a settle reports, what a reply grants, the fall back."""

from __future__ import annotations

import pytest

from sidecar.fleet import FleetMember, RetryBudgetShare, keys
from sidecar.policy import RetryBudget


def member(n: int = 1, fallback: int = 3) -> tuple[FleetMember, list[RetryBudget]]:
    budgets = [RetryBudget(0.2, 10, 10, now=0.0) for _ in range(n)]
    shares = [RetryBudgetShare(f"up{i}", b, 10) for i, b in enumerate(budgets)]
    return FleetMember("me", "retry-sidecar:", shares, lease=0.2, fallback_members=fallback), budgets


def test_keys_share_one_hash_tag():
    ks = keys("p:", ["orders", "users"])
    assert ks == [
        "{p:}members",
        "{p:}budget:orders",
        "{p:}demand:orders",
        "{p:}budget:users",
        "{p:}demand:users",
    ]


def test_before_any_settle_each_budget_stands_alone_as_one_of_fallback_members():
    m, (b,) = member(fallback=4)
    assert m.up == 0 and m.members == 4
    assert not b.leased and b.capacity == pytest.approx(2.5)


def test_request_reports_new_requests_returned_lease_and_smoothed_demand():
    m, (b,) = member()
    for _ in range(7):
        b.on_request(1.0)
    for _ in range(4):
        b.acquire(1.0)
    args = m.request()
    assert args[:4] == ["me", m.ttl, 1, m.expire]
    assert args[4:] == [0.2, 10, 10, 10, 7, 0.0, 2.0]  # spec, 7 requests, nothing leased, demand 0.5 x 4
    assert m.request()[4:][4:] == [0, 0.0, 1.0]  # nothing new: demand decays


def test_a_reply_grants_leases_and_sets_members_and_logs_only_the_change():
    m, (b,) = member()
    m.request()
    assert m.settled([5, b"3.5", b"0.25"], 0.001) is not None  # first contact is logged
    assert b.leased and b.lease == 3.5 and m.up == 1 and m.members == 5
    assert m.share_by_name() == {"up0": 0.25}
    m.request()
    assert m.settled([5, "1", "0.2"], 0.001) is None


def test_spending_while_a_settle_is_out_is_charged_to_the_next_lease():
    m, (b,) = member()
    m.request()
    m.settled([1, "3", "1"], 0.001)
    args = m.request()
    assert args[-2] == 3.0  # the unused lease goes back...
    assert b.acquire(0.0) and b.acquire(0.0)  # ...but two of it are spent before the reply comes
    m.settled([1, "5", "1"], 0.001)
    assert b.lease == 3.0


def test_failure_falls_back_to_the_members_last_seen_and_logs_once_per_outage():
    m, (b,) = member(fallback=1)
    m.request()
    m.settled([4, "2", "0.25"], 0.001)
    assert m.failed("timeout", 0.005) is not None
    assert m.up == 0 and m.members == 4 and not b.leased and b.capacity == pytest.approx(2.5)
    assert m.failed("timeout", 0.005) is None  # once per outage
    assert m.settled([2, "1", "0.5"], 0.001) is not None  # rejoined: logged
    assert m.failed("refused", 0.0) is not None  # a new outage: logged again


def test_never_reached_redis_logs_the_first_failure_only():
    m, (b,) = member(fallback=2)
    assert m.failed("refused", 0.0) is not None
    assert m.failed("refused", 0.0) is None
    assert m.members == 2 and b.capacity == 5.0


def test_a_malformed_reply_is_a_failure_not_a_crash():
    m, (b,) = member()
    assert m.settled([1], 0.001) is not None
    assert m.up == 0 and not b.leased


@pytest.mark.parametrize("reply", [[], [b"x", b"1", b"1"], [1, b"1"], [1, None, b"1"], [0, b"1", b"1"]])
def test_any_malformed_reply_is_a_failure(reply):
    m, (b,) = member()
    m.settled([1, "2", "1"], 0.001)
    assert m.settled(reply, 0.001) is not None
    assert m.up == 0 and not b.leased


# -- a fleet-wide request rate (admission requests.scope: fleet) ------------------------------------------
class Paced:
    """A listener's limiter as the share sees it: requests that asked, and the pace it was last given."""

    def __init__(self) -> None:
        self.attempted = 0
        self.paces: list[tuple[float, float]] = []

    def pace(self, rate: float, burst: float) -> None:
        self.paces.append((rate, burst))


def test_a_rate_share_reports_smoothed_demand_and_paces_its_bucket_by_its_share() -> None:
    from sidecar.fleet.member import RateLimitShare

    limit = Paced()
    share = RateLimitShare("admission:web", limit, rate=100.0, burst=2.0)
    assert share.spec.ratio == 0 and share.spec.rate == 100 and share.spec.capacity == 200
    share.stand_alone(4)  # before the first settle, or Redis gone: a quarter of the fleet's rate
    assert limit.paces[-1] == (25.0, 2.0) and share.share == 0.25
    limit.attempted = 40
    assert share.report().demand == 20.0  # half of the 40 that asked, half of the 0 before
    limit.attempted = 60
    assert share.report().demand == 20.0  # (20 + 20) / 2
    share.granted(tokens=7.0, share=0.8)  # the share of the rate, whatever the tokens
    assert limit.paces[-1] == (80.0, 2.0) and share.share == 0.8
