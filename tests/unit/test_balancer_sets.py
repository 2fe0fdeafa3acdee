"""The balancer's set of endpoints changing under it (a name resolved again, a reload): an endpoint that stays
keeps its state, a new one starts fresh, one that left drains (no new attempt, not even a probe; told once its
last outstanding attempt finished). On a clock moved by hand, with the engine driving real calls."""

from __future__ import annotations

import random

from sidecar.policy import START, AttemptEnded, OutcomeClass, RetryPolicy
from sidecar.policy import Reason as R
from sidecar.upstream.balancer import ACTIVE, DRAINING, EJECTED, Balancer
from sidecar.upstream.outlier import OutlierSpec
from tests.unit.playbook import CONNECT, OK, UNAVAILABLE, Driver, make_call

C = OutcomeClass
SEEDS = range(40)


def picks(b: Balancer, now: float = 0.0) -> set[str | None]:
    return {b.pick(now, random.Random(s).random) for s in SEEDS}


def drained_log(b: Balancer) -> list[str]:
    told: list[str] = []
    b.on_drained = told.append
    return told


def test_an_endpoint_that_stays_keeps_its_outstanding_cooldown_and_ejection() -> None:
    b = Balancer(["a", "b", "c"], cooldown=5.0, outliers=OutlierSpec(consecutive_errors=1))
    b.started("a")
    b.penalize("b", now=0.0)
    b.observe("c", C.UNAVAILABLE, 0.0)
    assert b.state("c") == EJECTED
    left = b.update(["c", "b", "a", "d"])
    assert left == []
    assert b.outstanding["a"] == 1
    assert b.penalized("b", 1.0)
    assert b.state("c") == EJECTED
    assert (b.state("d"), b.outstanding["d"]) == (ACTIVE, 0)


def test_an_endpoint_that_left_gets_no_new_attempt_not_even_a_probe() -> None:
    b = Balancer(["a", "b"], outliers=OutlierSpec(consecutive_connect_failures=1))
    b.observe("a", C.CONNECT_FAILURE, 0.0)  # ejected; its probe would be due at 5s
    b.update(["b"])
    assert picks(b, now=100.0) == {"b"}
    assert b.outliers is not None and not b.outliers.is_ejected("a")  # its record went with it
    assert b.state("a") == ""


def test_an_idle_endpoint_that_left_is_drained_at_once() -> None:
    b = Balancer(["a", "b"])
    told = drained_log(b)
    assert b.update(["b"]) == ["a"]
    assert told == ["a"] and "a" not in b.outstanding and b.state("a") == ""


def test_a_busy_endpoint_drains_until_its_last_attempt_finished() -> None:
    b = Balancer(["a", "b"])
    told = drained_log(b)
    b.started("a")
    b.started("a")
    b.update(["b"])
    assert (told, b.state("a"), list(b.draining)) == ([], DRAINING, ["a"])
    b.finished("a")
    assert told == []
    b.finished("a")
    assert told == ["a"] and not b.draining and b.state("a") == ""


def test_an_endpoint_back_before_its_drain_ended_keeps_its_attempts_and_is_not_drained() -> None:
    b = Balancer(["a", "b"])
    told = drained_log(b)
    b.started("a")
    b.update(["b"])
    b.update(["b", "a"])
    assert b.state("a") == ACTIVE and b.outstanding["a"] == 1
    b.finished("a")
    assert told == [] and b.outstanding["a"] == 0


def test_an_empty_set_answers_no_endpoint_at_once() -> None:
    b = Balancer(["a"])
    b.update([])
    d = Driver(make_call(balancer=b))
    out = d(START)
    assert d.finish.reason is R.NO_ENDPOINT and d.finish.attempts == 0
    assert out[-1] is d.finish


def test_the_retry_of_an_attempt_whose_endpoint_left_goes_to_one_that_stays() -> None:
    b = Balancer(["a", "b"])
    told = drained_log(b)
    d = Driver(make_call(RetryPolicy(max_attempts=3), balancer=b, rand=random.Random(1).random))
    d(START)
    first = d.sends[0].endpoint
    other = "b" if first == "a" else "a"
    b.update([other, "c"])  # the first attempt's endpoint left while it was out
    assert told == []
    d(AttemptEnded(1, UNAVAILABLE), at=0.1)
    assert told == [first]  # its last attempt finished: its connections may close
    d.tick()  # the backoff is over: the retry
    assert d.sends[1].endpoint in {other, "c"}
    d(AttemptEnded(2, OK), at=d.now)
    assert d.finish.reason is R.SUCCESS


def test_a_connect_failure_to_an_endpoint_that_left_retries_at_once_elsewhere() -> None:
    b = Balancer(["a", "b"])
    d = Driver(make_call(RetryPolicy(max_attempts=2), balancer=b, rand=random.Random(2).random))
    d(START)
    first = d.sends[0].endpoint
    b.update(["b" if first == "a" else "a"])
    d(AttemptEnded(1, CONNECT), at=0.0)  # the adapter found no pool for it any more
    assert [s.endpoint for s in d.sends][1] != first
    assert d.decisions[0].reason is R.TRANSPARENT_RETRY


def test_a_reload_reconfigures_the_same_endpoints() -> None:
    b = Balancer(["a", "b"], cooldown=5.0, outliers=OutlierSpec(consecutive_errors=1))
    b.observe("a", C.UNAVAILABLE, 0.0)
    b.reconfigure(1.0, OutlierSpec(consecutive_errors=3))
    assert b.cooldown == 1.0 and b.state("a") == EJECTED
    assert b.outliers is not None and b.outliers.spec.consecutive_errors == 3
    b.reconfigure(1.0, None)
    assert b.outliers is None and b.state("a") == ACTIVE
    b.reconfigure(1.0, OutlierSpec())
    assert b.outliers is not None and b.state("a") == ACTIVE
