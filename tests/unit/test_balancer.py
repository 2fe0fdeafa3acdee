"""Endpoint choice: P2C by outstanding requests, avoiding tried, deprioritized and penalized endpoints."""

import random

import pytest

from sidecar.policy import BUFFER_EXCEEDED, CLIENT_GONE, START, HedgingSpec, RetryPolicy
from sidecar.upstream.balancer import Balancer
from tests.unit.playbook import (
    OK,
    OVERLOADED,
    UNAVAILABLE,
    Driver,
    StrictBalancer,
    make_call,
    run,
    scripted,
)

NEVER = scripted()  # a rand that must not be drawn
SEEDS = range(30)


def first_endpoints(balancer: Balancer, now: float) -> set[str]:
    """Where a new request's first attempt goes, over many seeds."""
    return {
        run(make_call(balancer=balancer, rand=random.Random(s).random), [OK], now=now).sends[0].endpoint
        for s in SEEDS
    }


# -- the picker alone ------------------------------------------------------------------------------------


def test_no_endpoint_gives_none():
    assert Balancer([]).pick(0.0, NEVER) is None
    assert Balancer(["a", "b"]).pick(0.0, NEVER, candidates=[]) is None


def test_a_single_endpoint_is_used_whatever_it_did():
    b = Balancer(["a"])
    b.penalize("a", 0.0)
    assert b.pick(1.0, NEVER, avoid={"a"}, deprioritized={"a"}) == "a"


@pytest.mark.parametrize(
    ("draws", "chosen"),
    [((0.0, 0.0), "b"), ((0.0, 0.9), "c"), ((0.5, 0.9), "b"), ((0.9, 0.0), "c")],
    ids=["a-vs-b", "a-vs-c", "b-vs-c", "c-vs-a"],
)
def test_p2c_takes_the_less_loaded_of_two_sampled(draws, chosen):
    b = Balancer(["a", "b", "c"])
    b.outstanding.update(a=3, b=0, c=1)
    assert b.pick(0.0, scripted(*draws)) == chosen


def test_p2c_never_picks_the_busiest_of_three():
    b = Balancer(["a", "b", "c"])
    b.outstanding.update(a=3, b=0, c=1)
    assert "a" not in {b.pick(0.0, random.Random(s).random) for s in SEEDS}


def test_p2c_tie_goes_to_the_first_sampled():
    assert Balancer(["a", "b", "c"]).pick(0.0, scripted(0.5, 0.0)) == "b"


def test_tried_endpoints_are_avoided_while_fresh_ones_exist():
    b = Balancer(["a", "b", "c"])
    assert {b.pick(0.0, random.Random(s).random, avoid={"a", "c"}) for s in SEEDS} == {"b"}


def test_deprioritized_ranks_below_tried():
    assert Balancer(["a", "b"]).pick(0.0, NEVER, avoid={"b"}, deprioritized={"a"}) == "b"


def test_penalty_lasts_exactly_the_cooldown():
    b = Balancer(["a", "b"], cooldown=5.0)
    b.penalize("a", 1.0)
    assert {b.pick(5.9, random.Random(s).random) for s in SEEDS} == {"b"}
    assert b.penalized("a", 5.9)
    assert not b.penalized("a", 6.0)
    assert {b.pick(6.0, random.Random(s).random) for s in SEEDS} == {"a", "b"}


def test_candidates_restrict_the_pool():
    b = Balancer(["a", "b", "c"])
    assert {b.pick(0.0, random.Random(s).random, candidates=["b", "c"]) for s in SEEDS} == {"b", "c"}


def test_outstanding_counts_never_go_negative():
    b = Balancer(["a"])
    b.started("a")
    b.finished("a")
    b.finished("a")
    assert b.outstanding == {"a": 0}


# -- the picker under the engine ---------------------------------------------------------------------------


def test_a_new_request_goes_to_the_idle_endpoint():
    balancer = StrictBalancer(["a", "b"])
    busy = Driver(make_call(balancer=balancer))
    (send, _) = busy(START)
    other = run(make_call(balancer=balancer, rand=random.Random(3).random), [OK])
    assert other.sends[0].endpoint != send.endpoint
    busy(CLIENT_GONE)
    assert balancer.outstanding == {"a": 0, "b": 0}


@pytest.mark.parametrize(("deprioritize", "third"), [(True, {"second"}), (False, {"first", "second"})])
def test_overloaded_endpoint_is_deprioritized_for_the_rest_of_the_request(deprioritize, third):
    """Two endpoints: the third attempt goes back to the one that answered overloaded only if allowed."""
    policy = RetryPolicy(max_attempts=3, deprioritize_overloaded=deprioritize)
    seen = set()
    for s in SEEDS:
        balancer = StrictBalancer(["a", "b"], cooldown=0.0)  # no cross-request penalty: this request only
        d = run(
            make_call(policy, balancer=balancer, rand=random.Random(s).random), [OVERLOADED, UNAVAILABLE, OK]
        )
        first, second, last = (x.endpoint for x in d.sends)
        assert second != first
        seen.add("second" if last == second else "first")
    assert seen == third


def test_overloaded_endpoint_is_avoided_by_every_request_during_the_cooldown():
    balancer = StrictBalancer(["a", "b"], cooldown=5.0)
    d = run(make_call(balancer=balancer), [OVERLOADED, OK], now=1.0)
    overloaded = d.sends[0].endpoint
    assert overloaded not in first_endpoints(balancer, now=3.0)
    assert overloaded not in first_endpoints(balancer, now=5.9)
    assert overloaded in first_endpoints(balancer, now=6.0)


def test_outstanding_returns_to_zero_after_every_kind_of_ending():
    balancer = StrictBalancer(["a", "b", "c"])
    hedging = RetryPolicy(hedging=HedgingSpec(max_attempts=3, delay=0.0), per_try_timeout=1.0)
    run(make_call(hedging, balancer=balancer), [None, (0.5, OK), None])  # losers cancelled
    run(make_call(hedging, balancer=balancer), [None] * 3)  # per-try timeouts
    run(make_call(hedging, balancer=balancer, deadline=0.5), [None] * 3)  # deadline
    run(make_call(balancer=balancer), [(1.0, OK)], events=[(0.5, CLIENT_GONE)])  # client gone
    run(make_call(balancer=balancer), [UNAVAILABLE, (1.0, UNAVAILABLE)], events=[(0.5, BUFFER_EXCEEDED)])
    assert balancer.outstanding == {"a": 0, "b": 0, "c": 0}
