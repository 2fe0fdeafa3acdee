"""The seed's RateLimiter (a token bucket that queues by borrowing) against hand-computed timelines, and its
invariants over random arrivals. Virtual time: ``now`` is passed in, nothing sleeps."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.admission import Count, Decision, RateLimiter, Rejection, Verdict

FAST = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


Seen = tuple[Verdict, float, "Rejection | None", int]


def seen(d: Decision) -> Seen:
    """A decision with its time to the nanosecond (the bucket's arithmetic is in floats)."""
    return d.verdict, round(d.at, 9), d.reason, d.waiter


def admitted(now: float) -> Seen:
    return Verdict.ADMITTED, now, None, 0


def rejected(reason: Rejection, at: float) -> Seen:
    return Verdict.REJECTED, at, reason, 0


def queued(at: float, waiter: int) -> Seen:
    return Verdict.QUEUED, at, None, waiter


# -- burst and refill --------------------------------------------------------------------------------------


def test_a_full_burst_then_one_token_per_refill_interval():
    """rate 10/s, burst 0.5 s: capacity 5. Five at once, then one each 100 ms; a refused request is told
    when the next token is free."""
    b = RateLimiter(rate=10, burst=0.5, now=100.0)
    assert b.capacity == 5
    assert [seen(b.try_acquire(100.0)) for _ in range(5)] == [admitted(100.0)] * 5
    assert seen(b.try_acquire(100.0)) == rejected(Rejection.RATE_EXCEEDED, 100.1)
    assert seen(b.try_acquire(100.05)) == rejected(Rejection.RATE_EXCEEDED, 100.1)
    assert seen(b.try_acquire(100.1)) == admitted(100.1)
    assert seen(b.try_acquire(100.15)) == rejected(Rejection.RATE_EXCEEDED, 100.2)
    assert b.available(100.15) == pytest.approx(0.5)
    assert seen(b.try_acquire(100.2)) == admitted(100.2)


def test_unused_rate_is_banked_only_up_to_the_capacity():
    b = RateLimiter(rate=10, burst=0.5, now=0.0)
    for _ in range(5):
        b.try_acquire(0.0)
    assert b.available(0.0) == 0
    assert b.available(0.3) == pytest.approx(3)
    assert b.available(60.0) == 5  # an idle minute banks one burst, not 600 tokens
    assert sum(b.try_acquire(60.0).admitted for _ in range(10)) == 5


def test_the_capacity_is_at_least_one_token():
    b = RateLimiter(rate=2, burst=0.1, now=0.0)  # 2 x 0.1 = 0.2 tokens: no request could ever pass
    assert b.capacity == 1
    assert b.try_acquire(0.0).admitted
    assert seen(b.try_acquire(0.0)) == rejected(Rejection.RATE_EXCEEDED, 0.5)


def test_max_queue_zero_never_queues():
    b = RateLimiter(rate=10, burst=0.1, now=0.0, max_queue=0, max_wait=10.0)
    assert b.acquire(0.0).admitted
    assert seen(b.acquire(0.0)) == rejected(Rejection.RATE_EXCEEDED, 0.1)
    assert b.queued == 0


# -- queueing by borrowing ---------------------------------------------------------------------------------


def test_queued_requests_borrow_tokens_and_wait_for_their_refill():
    """rate 10/s, capacity 1: the seed's example, four times over. Each borrow pushes the balance one token
    further below zero and the wait 100 ms further out; the queue depth is checked before borrowing."""
    b = RateLimiter(rate=10, burst=0.1, now=0.0, max_queue=3, max_wait=1.0)
    assert seen(b.acquire(0.0)) == admitted(0.0)
    assert seen(b.acquire(0.0)) == queued(0.1, 1)
    assert seen(b.acquire(0.0)) == queued(0.2, 2)
    assert seen(b.acquire(0.0)) == queued(0.3, 3)
    assert b.balance(0.0) == pytest.approx(-3)
    assert b.available(0.0) == 0
    assert seen(b.acquire(0.0)) == rejected(Rejection.QUEUE_FULL, 0.4)  # the next free token is after the three
    assert b.balance(0.0) == pytest.approx(-3)  # a rejection takes nothing
    assert b.admit_queued(1) == pytest.approx(0.1)
    assert b.queued == 2
    assert seen(b.acquire(0.1)) == queued(0.4, 4)  # a place freed: it queues behind the others


def test_a_wait_beyond_max_wait_is_rejected_at_once_and_takes_nothing():
    b = RateLimiter(rate=10, burst=0.1, now=0.0, max_queue=100, max_wait=0.25)
    assert b.acquire(0.0).admitted
    assert seen(b.acquire(0.0)) == queued(0.1, 1)
    assert seen(b.acquire(0.0)) == queued(0.2, 2)
    assert seen(b.acquire(0.0)) == rejected(Rejection.MAX_WAIT, 0.3)  # would wait 300 ms
    assert seen(b.acquire(0.0)) == rejected(Rejection.MAX_WAIT, 0.3)  # still: nothing was borrowed
    assert seen(b.acquire(0.05)) == queued(0.3, 3)  # 250 ms: exactly max_wait is allowed


def test_a_wait_that_would_reach_the_deadline_is_rejected_at_once():
    b = RateLimiter(rate=10, burst=0.1, now=0.0, max_queue=100, max_wait=5.0)
    assert b.acquire(0.0, deadline=0.01).admitted  # a token now: the deadline does not matter
    assert seen(b.acquire(0.0, deadline=0.1)) == rejected(Rejection.DEADLINE, 0.1)  # at the deadline is too late
    assert seen(b.acquire(0.0, deadline=0.15)) == queued(0.1, 1)
    assert seen(b.acquire(0.0, deadline=0.15)) == rejected(Rejection.DEADLINE, 0.2)


def test_an_interrupted_waiter_gives_its_token_back():
    b = RateLimiter(rate=10, burst=0.1, now=0.0, max_queue=10, max_wait=5.0)
    b.acquire(0.0)
    assert [b.acquire(0.0).at for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert b.balance(0.05) == pytest.approx(-2.5)
    b.interrupt(2)  # its client went away at 50 ms
    assert b.balance(0.05) == pytest.approx(-1.5)
    assert b.queued == 2
    assert seen(b.acquire(0.05)) == queued(0.3, 4)  # would have been 0.4 without the token given back
    with pytest.raises(KeyError, match="waiter 2"):
        b.admit_queued(2)
    s = b.stats.counts()
    assert (s[Count.ADDED_TO_QUEUE], s[Count.REMOVED_FROM_QUEUE], s[Count.INTERRUPTED_IN_QUEUE]) == (4, 1, 1)


def test_the_counters_follow_the_seed():
    b = RateLimiter(rate=10, burst=0.1, now=0.0, max_queue=1, max_wait=1.0)
    b.exempt()
    b.acquire(0.0)  # admitted
    b.acquire(0.0)  # queued as 1
    b.acquire(0.0)  # queue full
    b.admit_queued(1)
    assert b.stats.counts() == {
        Count.ATTEMPTED: 3,
        Count.SUCCESSFUL: 2,
        Count.REJECTED: 1,
        Count.EXEMPTED: 1,
        Count.ADDED_TO_QUEUE: 1,
        Count.REMOVED_FROM_QUEUE: 1,
        Count.INTERRUPTED_IN_QUEUE: 0,
    }
    assert b.stats.rejected_by[Rejection.QUEUE_FULL] == 1


# -- changes at run time -----------------------------------------------------------------------------------


def test_a_faster_rate_keeps_the_queue_and_serves_new_requests_sooner():
    b = RateLimiter(rate=10, burst=0.1, now=0.0, max_queue=10, max_wait=5.0)
    b.acquire(0.0)
    assert seen(b.acquire(0.0)) == queued(0.1, 1)
    assert seen(b.acquire(0.0)) == queued(0.2, 2)
    b.reconfigure(0.0, rate=20, burst=1.0)
    assert (b.queued, b.capacity) == (2, 20)
    assert b.balance(0.0) == pytest.approx(-2)  # the two borrowed tokens are still owed
    assert seen(b.acquire(0.0)) == queued(0.15, 3)  # behind them, at the new rate: 3 tokens / 20 per s
    assert b.admit_queued(2) == pytest.approx(0.2)  # queued ones keep the time they were given


def test_a_smaller_burst_caps_what_was_banked():
    b = RateLimiter(rate=10, burst=1.0, now=0.0)
    assert b.available(5.0) == 10
    b.reconfigure(5.0, rate=2, burst=1.0)
    assert b.available(5.0) == 2
    assert b.available(5.5) == 2
    assert sum(b.try_acquire(5.5).admitted for _ in range(5)) == 2
    assert seen(b.try_acquire(5.5)) == rejected(Rejection.RATE_EXCEEDED, 6.0)


@pytest.mark.parametrize(
    ("rate", "burst", "message"),
    [(0, 1, "rate"), (-1, 1, "rate"), (math.inf, 1, "rate"), (10, 0, "burst"), (10, math.nan, "burst")],
)
def test_a_bucket_that_cannot_work_is_refused_with_the_reason(rate: float, burst: float, message: str):
    with pytest.raises(ValueError, match=message):
        RateLimiter(rate=rate, burst=burst, now=0.0)


def test_a_negative_queue_is_refused():
    with pytest.raises(ValueError, match="max_queue"):
        RateLimiter(rate=1, burst=1, now=0.0, max_queue=-1)
    with pytest.raises(ValueError, match="max_wait"):
        RateLimiter(rate=1, burst=1, now=0.0, max_wait=-0.1)


# -- invariants --------------------------------------------------------------------------------------------

RATES = st.sampled_from([1.0, 3.0, 10.0, 250.0])
BURSTS = st.sampled_from([0.1, 0.5, 1.0, 2.0])
GAPS = st.lists(st.floats(min_value=0.0, max_value=0.5, allow_nan=False), min_size=1, max_size=150)


def _run(rate: float, burst: float, gaps: list[float], max_queue: int, interrupt_every: int) -> tuple[
    RateLimiter, list[float], list[float]
]:
    """Arrivals at the given gaps; returns the bucket, the admission times, and the available tokens seen."""
    b = RateLimiter(rate=rate, burst=burst, now=0.0, max_queue=max_queue, max_wait=2.0)
    now = 0.0
    times: list[float] = []
    waiting: list[tuple[float, int]] = []
    seen: list[float] = []
    for i, gap in enumerate(gaps):
        now += gap
        # waiters whose time has come are admitted, in order
        for at, w in [x for x in waiting if x[0] <= now]:
            b.admit_queued(w)
            times.append(at)
            waiting.remove((at, w))
        d = b.acquire(now, deadline=now + 1.5)
        if d.admitted:
            times.append(now)
        elif d.queued:
            if interrupt_every and i % interrupt_every == 0:
                b.interrupt(d.waiter)
            else:
                waiting.append((d.at, d.waiter))
        seen.append(b.available(now))
    for at, w in waiting:
        b.admit_queued(w)
        times.append(at)
    return b, sorted(times), seen


@FAST
@given(RATES, BURSTS, GAPS, st.integers(0, 20), st.sampled_from([0, 2, 5]))
def test_tokens_never_exceed_the_capacity(rate, burst, gaps, max_queue, interrupt_every):
    b, _, seen = _run(rate, burst, gaps, max_queue, interrupt_every)
    assert max(seen) <= b.capacity + 1e-9
    assert b.queued == 0


@FAST
@given(RATES, BURSTS, GAPS, st.integers(0, 20), st.sampled_from([0, 2, 5]))
def test_admissions_by_any_time_stay_within_rate_times_time_plus_capacity(
    rate, burst, gaps, max_queue, interrupt_every
):
    """From a full bucket at 0, the admissions by time T (immediate, and queued ones at their time) never
    exceed rate x T + capacity, interrupted waiters included."""
    b, times, _ = _run(rate, burst, gaps, max_queue, interrupt_every)
    for n, t in enumerate(times, start=1):
        assert n <= rate * t + b.capacity + 1e-6 * n


@FAST
@given(RATES, BURSTS, GAPS, st.integers(0, 20))
def test_without_interruptions_every_window_conforms(rate, burst, gaps, max_queue):
    """Any window [a, b] between two admissions holds at most rate x (b - a) + capacity of them."""
    b, times, _ = _run(rate, burst, gaps, max_queue, 0)
    for i in range(len(times)):
        for j in range(i, len(times)):
            assert j - i + 1 <= rate * (times[j] - times[i]) + b.capacity + 1e-6 * len(times)


@FAST
@given(RATES, BURSTS, GAPS, st.integers(1, 20))
def test_a_queued_wait_never_exceeds_max_wait_nor_the_deadline(rate, burst, gaps, max_queue):
    b = RateLimiter(rate=rate, burst=burst, now=0.0, max_queue=max_queue, max_wait=0.3)
    now = 0.0
    for gap in gaps:
        now += gap
        d = b.acquire(now, deadline=now + 0.2)
        if d.queued:
            assert now < d.at <= now + 0.2
            b.admit_queued(d.waiter)  # (admitted early: only the decision is under test)
        elif d.rejected:
            assert d.at > now


@FAST
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 0.5),  # time since the previous step
            st.sampled_from(["acquire", "try", "reconfigure", "interrupt", "admit"]),
            RATES,
            BURSTS,
        ),
        max_size=150,
    )
)
def test_reconfiguring_never_loses_a_waiter_nor_overfills_the_bucket(steps):
    b = RateLimiter(rate=10, burst=1, now=0.0, max_queue=10, max_wait=3.0)
    now = 0.0
    waiting: list[int] = []
    for gap, op, rate, burst in steps:
        now += gap
        if op == "acquire":
            d = b.acquire(now)
            if d.queued:
                waiting.append(d.waiter)
        elif op == "try":
            assert not b.try_acquire(now).queued
        elif op == "reconfigure":
            before = b.balance(now)
            b.reconfigure(now, rate, burst)
            # borrowed tokens stay owed; banked ones are kept up to the new capacity
            assert b.balance(now) == pytest.approx(min(before, b.capacity), abs=1e-9)
        elif op == "interrupt" and waiting:
            b.interrupt(waiting.pop())
        elif op == "admit" and waiting:
            b.admit_queued(waiting.pop(0))
        assert b.available(now) <= b.capacity
        assert b.queued == len(waiting)


def test_take_is_acquire_when_a_token_is_free_and_does_nothing_when_none_is() -> None:
    fast, slow = RateLimiter(rate=10, burst=0.2, now=0.0), RateLimiter(rate=10, burst=0.2, now=0.0)
    for now in (0.0, 0.0, 0.05, 0.1, 0.1, 0.25, 0.26, 0.3):
        took = fast.take(now)
        if not took:
            before = fast.stats.counts()
            assert fast.balance(now) < 1.0 and fast.stats.counts() == before
            took = fast.acquire(now).admitted  # what a caller does next
        assert took == slow.acquire(now).admitted
        assert fast.balance(now) == pytest.approx(slow.balance(now))
    assert fast.stats.counts() == slow.stats.counts()
