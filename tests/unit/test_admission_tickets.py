"""Per-endpoint ticket pools: FIFO waiters expressed purely, rejections decided at once, limit changes that
never strand a waiter, and what the prober reads. Virtual time, nothing sleeps."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.admission import Count, Decision, Interval, Kind, Rejection, TicketPool, TicketPools, Verdict

FAST = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def test_tickets_up_to_the_limit_then_a_fifo_queue():
    p = TicketPool(Kind.WRITE, limit=2, max_queue=10, max_wait=1.0)
    assert p.acquire(0.0) == Decision(Verdict.ADMITTED, 0.0)
    assert p.acquire(0.0).admitted
    assert p.acquire(0.0) == Decision(Verdict.QUEUED, 1.0, None, 1)  # gives up at now + max_wait
    assert p.acquire(0.5) == Decision(Verdict.QUEUED, 1.5, None, 2)
    assert p.acquire(0.6) == Decision(Verdict.QUEUED, 1.6, None, 3)
    assert (p.in_use, p.queued, p.available) == (2, 3, 0)
    assert p.release() == 1  # the ticket passes to the first waiter: still two in use
    assert p.release() == 2
    assert p.in_use == 2
    assert p.release() == 3
    assert p.release() == 0
    assert (p.in_use, p.queued) == (1, 0)


def test_a_try_never_queues_and_never_jumps_the_queue():
    p = TicketPool(Kind.READ, limit=1, max_queue=5, max_wait=1.0)
    assert p.try_acquire()
    assert not p.try_acquire()
    assert p.acquire(0.0).queued
    assert p.release() == 1
    p.set_limit(2)  # a free ticket now, but nobody waits: a try gets it
    assert p.try_acquire()
    p.set_limit(3)
    assert p.acquire(0.0).admitted
    assert p.acquire(0.0).queued
    assert not p.try_acquire()  # a waiter is first in line


def test_what_can_be_known_at_once_is_rejected_at_once():
    p = TicketPool(Kind.WRITE, limit=1, max_queue=1, max_wait=1.0)
    p.acquire(0.0)
    assert p.acquire(0.0, deadline=0.0) == Decision(Verdict.REJECTED, 0.0, Rejection.DEADLINE)
    assert p.acquire(0.0).queued
    assert p.acquire(0.0) == Decision(Verdict.REJECTED, 0.0, Rejection.QUEUE_FULL)
    no_wait = TicketPool(Kind.WRITE, limit=1, max_queue=10, max_wait=0.0)
    no_wait.acquire(0.0)
    assert no_wait.acquire(0.0) == Decision(Verdict.REJECTED, 0.0, Rejection.MAX_WAIT)
    no_queue = TicketPool(Kind.WRITE, limit=1)
    no_queue.acquire(0.0)
    assert no_queue.acquire(0.0).reason is Rejection.QUEUE_FULL


def test_a_waiter_gives_up_at_max_wait_or_its_deadline_whichever_is_first():
    p = TicketPool(Kind.WRITE, limit=1, max_queue=10, max_wait=1.0)
    p.acquire(0.0)
    a = p.acquire(0.0, deadline=5.0)
    b = p.acquire(0.0, deadline=0.4)
    c = p.acquire(0.2)
    assert (a.at, b.at, c.at) == (1.0, 0.4, 1.2)
    assert p.expire(0.39) == []
    assert p.expire(0.4) == [(b.waiter, Rejection.DEADLINE)]
    assert p.give_up(a.waiter) is Rejection.MAX_WAIT
    assert p.give_up(a.waiter) is None  # already gone
    assert p.release() == c.waiter
    assert p.give_up(c.waiter) is None  # granted before its timer: it holds the ticket
    s = p.stats
    assert (s.rejected_by[Rejection.DEADLINE], s.rejected_by[Rejection.MAX_WAIT]) == (1, 1)


def test_an_interrupted_waiter_leaves_the_line():
    p = TicketPool(Kind.READ, limit=1, max_queue=10, max_wait=1.0)
    p.acquire(0.0)
    a, b = p.acquire(0.0), p.acquire(0.0)
    assert p.cancel(a.waiter)
    assert not p.cancel(a.waiter)
    assert p.release() == b.waiter
    assert not p.cancel(b.waiter)  # granted: the caller must release its ticket
    p.exempt()  # an exempt attempt takes nothing, and is counted
    assert (p.in_use, p.queued) == (1, 0)
    counts = p.stats.counts()
    assert counts[Count.EXEMPTED] == 1
    assert counts[Count.INTERRUPTED_IN_QUEUE] == 1
    assert counts[Count.REMOVED_FROM_QUEUE] == 2
    assert counts[Count.SUCCESSFUL] == 2


def test_a_larger_limit_grants_waiters_at_once_in_order():
    p = TicketPool(Kind.WRITE, limit=1, max_queue=10, max_wait=1.0)
    p.acquire(0.0)
    waiters = [p.acquire(0.0).waiter for _ in range(4)]
    assert p.set_limit(3) == waiters[:2]
    assert (p.in_use, p.queued) == (3, 2)
    assert p.set_limit(10) == waiters[2:]


def test_a_smaller_limit_takes_effect_as_tickets_come_back():
    p = TicketPool(Kind.WRITE, limit=4, max_queue=10, max_wait=1.0)
    for _ in range(4):
        p.acquire(0.0)
    w = p.acquire(0.0).waiter
    assert p.set_limit(2) == []
    assert p.in_use == 4  # nothing is revoked
    assert p.release() == 0
    assert p.release() == 0
    assert p.in_use == 2
    assert p.release() == w  # at the new limit: the ticket passes on, in use stays 2
    assert p.in_use == 2


def test_a_ticket_released_twice_is_an_error():
    p = TicketPool(Kind.READ, limit=1)
    with pytest.raises(ValueError, match="never acquired"):
        p.release()


@pytest.mark.parametrize("limit", [0, -3])
def test_a_pool_without_tickets_is_refused(limit: int):
    with pytest.raises(ValueError, match="limit"):
        TicketPool(Kind.READ, limit=limit)


def test_the_interval_reports_returns_exhaustion_and_what_was_let_in_or_turned_away():
    p = TicketPool(Kind.READ, limit=3, max_queue=1, max_wait=1.0)
    p.acquire(0.0)
    p.acquire(0.0)
    p.release()
    assert p.take_interval() == Interval(1, False, peak=2, admitted=2)  # peak 2 of 3
    for _ in range(2):
        p.acquire(0.0)
    assert p.take_interval() == Interval(0, True, peak=3, admitted=2)  # peak 3 of 3
    p.release()
    assert p.take_interval() == Interval(1, True, peak=3)  # still full when the interval began
    assert p.take_interval() == Interval(0, False, peak=2)
    p.acquire(0.0)
    w = p.acquire(0.0)  # queued
    assert w.queued and p.acquire(0.0).rejected  # the queue holds one: refused
    assert p.take_interval() == Interval(0, True, peak=3, admitted=1, refused=1, queued=1)
    p.set_limit(5)  # the waiter is granted at once, but someone had to queue
    assert p.take_interval() == Interval(0, True, peak=4, admitted=1)
    assert p.try_acquire() and not p.try_acquire()
    assert p.take_interval() == Interval(0, True, peak=5, admitted=1, refused=1)


def test_a_waiter_whose_wait_runs_out_counts_as_refused():
    p = TicketPool(Kind.READ, limit=1, max_queue=1, max_wait=1.0)
    p.acquire(0.0)
    w = p.acquire(0.0)
    p.take_interval()
    assert p.give_up(w.waiter) is Rejection.MAX_WAIT
    assert p.take_interval() == Interval(0, True, peak=1, refused=1)


def test_an_abandoned_ticket_counts_until_it_is_released_as_such():
    p = TicketPool(Kind.READ, limit=2, max_queue=1, max_wait=1.0)
    p.acquire(0.0)
    p.acquire(0.0)
    w = p.acquire(0.0)
    p.abandon()  # its attempt was given up on: the upstream may still hold the request
    assert (p.in_use, p.abandoned, p.available) == (2, 1, 0)
    assert p.release(abandoned=True) == w.waiter  # the upstream let it go: the ticket goes on to the waiter
    assert (p.in_use, p.abandoned) == (2, 0)
    with pytest.raises(ValueError, match="not abandoned"):
        p.release(abandoned=True)
    p.release()
    p.release()
    with pytest.raises(ValueError, match="not held"):
        p.abandon()


def test_both_pools_of_an_endpoint():
    pools = TicketPools(read=2, write=1, max_queue=4, max_wait=1.0)
    assert pools.pool(Kind.READ).acquire(0.0).admitted
    assert pools.pool(Kind.WRITE).acquire(0.0).admitted
    w = pools.pool(Kind.WRITE).acquire(0.0)
    assert w.queued  # the write pool is full; reads are not affected
    assert pools.pool(Kind.READ).acquire(0.0).admitted
    assert (pools.limit, pools.in_use) == (3, 3)
    assert pools.set_limits(read=2, write=2) == [(Kind.WRITE, w.waiter)]
    pools.read.release()
    pools.write.abandon()
    assert (pools.in_use, pools.abandoned) == (3, 1)
    assert pools.take_interval() == Interval(1, True, peak=4, admitted=4)


# -- invariants --------------------------------------------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.floats(0.0, 3.0)),  # deadline in seconds from now
        st.tuples(st.just("release"), st.just(0.0)),
        st.tuples(st.just("limit"), st.integers(1, 8).map(float)),
        st.tuples(st.just("cancel"), st.just(0.0)),
        st.tuples(st.just("tick"), st.floats(0.0, 0.5)),
    ),
    max_size=120,
)


@FAST
@given(st.integers(1, 6), st.integers(0, 6), OPS)
def test_in_use_never_exceeds_the_limit_when_granting_and_nobody_is_stranded(limit, max_queue, ops):
    p = TicketPool(Kind.WRITE, limit=limit, max_queue=max_queue, max_wait=1.0)
    now = 0.0
    held = 0  # tickets the callers hold
    line: list[int] = []  # waiters in the order they queued
    granted_order: list[int] = []
    for op, x in ops:
        granted: list[int] = []
        if op == "acquire":
            d = p.acquire(now, deadline=now + x)
            if d.admitted:
                held += 1
                assert p.in_use <= p.limit
            elif d.queued:
                line.append(d.waiter)
                assert now < d.at <= now + 1.0
        elif op == "release" and held:
            held -= 1
            w = p.release()
            if w:
                granted.append(w)
        elif op == "limit":
            granted = p.set_limit(int(x))
        elif op == "cancel" and line:
            assert p.cancel(line.pop())
        elif op == "tick":
            now += x
            for w, _ in p.expire(now):
                line.remove(w)
        for w in granted:
            assert w == line.pop(0)  # first come, first served
            granted_order.append(w)
            held += 1
            assert p.in_use <= p.limit
        assert p.in_use == held
        assert p.queued == len(line)
        if p.in_use < p.limit:
            assert not line  # a free ticket and a waiter never coexist
    assert granted_order == sorted(granted_order)
    assert math.isfinite(now)
