"""The Call state machine in hedging mode: several attempts in flight, the first success wins."""

import pytest

from sidecar.policy import (
    BUFFER_EXCEEDED,
    START,
    AttemptEnded,
    CancelAttempt,
    Committed,
    Decision,
    Finish,
    HedgingSpec,
    OutcomeClass,
    Reason,
    RetryPolicy,
    SendAttempt,
    ThrottleKind,
    ThrottleSpec,
    Wake,
    make_throttle,
)
from tests.unit.playbook import FATAL, OK, OVERLOADED, RESET, UNAVAILABLE, Driver, make_call, pushback, run

C = OutcomeClass
R = Reason


def hedged(max_attempts: int = 3, delay: float = 0.25, **kw) -> RetryPolicy:
    return RetryPolicy(hedging=HedgingSpec(max_attempts=max_attempts, delay=delay), **kw)


ANYWHERE = "*"


def anywhere(out: list) -> list:
    """``out`` with every SendAttempt's endpoint replaced by ``ANYWHERE`` (when the test does not care where)."""
    return [
        SendAttempt(c.attempt, ANYWHERE, c.timeout, c.whole_deadline, c.hedge)
        if isinstance(c, SendAttempt)
        else c
        for c in out
    ]


def send_times(d: Driver) -> list[float]:
    return [t for t, _ in d.timed(SendAttempt)]


def test_timeline_first_success_wins_and_the_others_are_cancelled():
    d = Driver(make_call(hedged(max_attempts=3, delay=0.05)))
    assert anywhere(d(START)) == [SendAttempt(1, ANYWHERE, 10.0, True, 0), Wake(0.05)]
    assert anywhere(d.tick()) == [SendAttempt(2, ANYWHERE, 10.0 - 0.05, True, 1), Wake(0.05 + 0.05)]
    assert anywhere(d.tick()) == [SendAttempt(3, ANYWHERE, 10.0 - 0.1, True, 2), Wake(10.0)]
    e1, e2, e3 = (s.endpoint for s in d.sends)
    assert len({e1, e2, e3}) == 3  # hedges go to distinct endpoints
    assert d.cancels == []  # a new attempt does not cancel the old ones
    assert d(AttemptEnded(2, OK), 0.12) == [
        Decision(2, e2, C.SUCCESS, R.SUCCESS),
        CancelAttempt(1, R.HEDGE_LOST),
        CancelAttempt(3, R.HEDGE_LOST),
        Finish(R.SUCCESS, 2, OK, 3),
    ]


def test_zero_delay_sends_every_copy_at_once():
    d = Driver(make_call(hedged(max_attempts=3, delay=0.0)))
    assert anywhere(d(START)) == [
        SendAttempt(1, ANYWHERE, 10.0, True, 0),
        SendAttempt(2, ANYWHERE, 10.0, True, 1),
        SendAttempt(3, ANYWHERE, 10.0, True, 2),
        Wake(10.0),
    ]


def test_a_single_endpoint_takes_every_hedge():
    d = run(make_call(hedged(delay=0.0), endpoints=["a"]), [UNAVAILABLE, UNAVAILABLE, OK])
    assert [s.endpoint for s in d.sends] == ["a", "a", "a"]
    assert d.finish == Finish(R.SUCCESS, 3, OK, 3)


def test_non_fatal_result_sends_the_next_hedge_at_once():
    d = Driver(make_call(hedged(max_attempts=3, delay=0.25)))
    (s1, _) = d(START)
    assert anywhere(d(AttemptEnded(1, UNAVAILABLE), 0.125)) == [
        Decision(1, s1.endpoint, C.UNAVAILABLE, R.HEDGE),
        SendAttempt(2, ANYWHERE, 10.0 - 0.125, True, 1),
        Wake(0.375),  # the hedge timer restarts from the new attempt
    ]
    assert anywhere(d.tick()) == [SendAttempt(3, ANYWHERE, 10.0 - 0.375, True, 2), Wake(10.0)]


def test_fatal_result_cancels_everything_and_is_delivered():
    d = Driver(make_call(hedged(max_attempts=3, delay=0.0)))
    d(START)
    assert d(AttemptEnded(2, FATAL), 0.125) == [
        Decision(2, d.sends[1].endpoint, C.FATAL, R.NOT_RETRYABLE),
        CancelAttempt(1, R.HEDGE_LOST),
        CancelAttempt(3, R.HEDGE_LOST),
        Finish(R.NOT_RETRYABLE, 2, FATAL, 3),
    ]


def test_all_hedges_failing_ends_with_attempts_exhausted():
    script = [(0.125, UNAVAILABLE), (0.25, OVERLOADED), (0.375, UNAVAILABLE)]
    d = run(make_call(hedged(max_attempts=3, delay=0.0)), script)
    assert [x.reason for x in d.decisions] == [R.AWAIT_HEDGES, R.AWAIT_HEDGES, R.ATTEMPTS_EXHAUSTED]
    assert (d.finished_at, d.finish) == (0.375, Finish(R.ATTEMPTS_EXHAUSTED, 3, UNAVAILABLE, 3))


def test_pushback_delays_the_next_hedge_then_the_delay_resumes():
    script = [(0.125, pushback(UNAVAILABLE, 0.5)), None, OK]
    d = run(make_call(hedged(max_attempts=3, delay=0.25)), script)
    assert send_times(d) == [0.0, 0.625, 0.875]
    assert d.decisions[0].reason is R.AWAIT_HEDGES
    assert d.cancels == [CancelAttempt(2, R.HEDGE_LOST)]
    assert d.finish == Finish(R.SUCCESS, 3, OK, 3)


@pytest.mark.parametrize(
    ("last", "finish"),
    [
        (UNAVAILABLE, Finish(R.PUSHBACK_NO_RETRY, 2, UNAVAILABLE, 2)),
        (OK, Finish(R.SUCCESS, 2, OK, 2)),
    ],
    ids=["outstanding-fails", "outstanding-succeeds"],
)
def test_pushback_stop_ends_hedging_but_lets_outstanding_attempts_finish(last, finish):
    script = [(0.375, pushback(UNAVAILABLE, None)), (0.25, last), OK]
    d = run(make_call(hedged(max_attempts=3, delay=0.25)), script)
    assert send_times(d) == [0.0, 0.25]  # nothing at 0.5
    assert d.decisions[0].reason is R.AWAIT_HEDGES
    assert d.cancels == []
    assert d.finish == finish


def test_committed_hedge_cancels_the_others_and_stops_hedging():
    d = Driver(make_call(hedged(max_attempts=3, delay=0.25)))
    d(START)
    d.tick()
    assert d(Committed(1), 0.375) == [CancelAttempt(2, R.HEDGE_LOST), Wake(10.0)]
    assert d(AttemptEnded(1, RESET), 1.0) == [
        Decision(1, d.sends[0].endpoint, C.RESET, R.COMMITTED),
        Finish(R.COMMITTED, 1, RESET, 2),
    ]


def test_deadline_cancels_every_outstanding_hedge():
    d = run(make_call(hedged(max_attempts=3, delay=0.0), deadline=1.0), [None] * 3)
    assert d.log[-4:] == [
        (1.0, CancelAttempt(1, R.DEADLINE)),
        (1.0, CancelAttempt(2, R.DEADLINE)),
        (1.0, CancelAttempt(3, R.DEADLINE)),
        (1.0, Finish(R.DEADLINE, None, None, 3)),
    ]


def test_buffer_exceeded_stops_hedging():
    d = run(
        make_call(hedged(max_attempts=3, delay=0.25)), [(0.5, UNAVAILABLE)], events=[(0.125, BUFFER_EXCEEDED)]
    )
    assert d.finish == Finish(R.BUFFER_EXCEEDED, 1, UNAVAILABLE, 1)


def test_per_try_timeout_is_a_result_like_any_other():
    p = RetryPolicy(
        per_try_timeout=0.5,
        hedging=HedgingSpec(max_attempts=2, delay=1.0, non_fatal=frozenset({C.TIMEOUT})),
    )
    d = run(make_call(p), [None, OK])
    assert d.cancels == [CancelAttempt(1, R.PER_TRY_TIMEOUT)]
    assert [x.reason for x in d.decisions] == [R.HEDGE, R.SUCCESS]
    assert send_times(d) == [0.0, 0.5]


def test_hedges_avoid_an_endpoint_that_answered_overloaded():
    d = run(
        make_call(hedged(max_attempts=3, delay=0.25), endpoints=["a", "b"]), [(0.125, OVERLOADED), None, OK]
    )
    first, second, third = (s.endpoint for s in d.sends)
    assert third == second != first  # the fresh-but-overloaded endpoint loses to the busy one


# -- throttling applies to hedges ------------------------------------------------------------------------


@pytest.mark.parametrize(("tokens", "sent"), [(5.0, 1), (5.5, 3)])
def test_grpc_bucket_at_half_allows_no_hedge(tokens, sent):
    bucket = make_throttle(ThrottleSpec(ThrottleKind.GRPC, max_tokens=10, token_ratio=0.5))
    bucket.tokens = tokens
    d = run(make_call(hedged(delay=0.0), throttle=bucket), [(0.5, OK)] * 3)
    assert len(d.sends) == sent


def test_grpc_bucket_refusing_a_hedge_ends_with_throttled():
    bucket = make_throttle(ThrottleSpec(ThrottleKind.GRPC, max_tokens=10, token_ratio=0.5))
    bucket.tokens = 5.0
    d = run(make_call(hedged(delay=0.25), throttle=bucket), [(0.5, UNAVAILABLE)])
    assert d.finish == Finish(R.THROTTLED, 1, UNAVAILABLE, 1)
    assert bucket.tokens == 4.0


def test_grpc_bucket_counts_non_fatal_hedge_failures():
    bucket = make_throttle(ThrottleSpec(ThrottleKind.GRPC, max_tokens=10, token_ratio=0.5))
    run(
        make_call(hedged(delay=0.0), throttle=bucket),
        [(0.125, UNAVAILABLE), (0.25, OVERLOADED), (0.5, FATAL)],
    )
    assert bucket.tokens == 8.0  # the fatal answer is not a failure A6 counts


def test_mongo_bucket_charges_every_hedge():
    bucket = make_throttle(ThrottleSpec(ThrottleKind.MONGODB))
    bucket.tokens = 500.0
    d = Driver(make_call(hedged(delay=0.0), throttle=bucket))
    d(START)
    assert bucket.tokens == 498.0
    d(AttemptEnded(1, OK), 0.5)
    assert bucket.tokens == pytest.approx(498.1, abs=1e-9)


# -- bugs ------------------------------------------------------------------------------------------------


def test_request_ends_when_the_last_hedge_fails_despite_an_earlier_pushback():
    # attempts at 0 and 0.25 (max 2); #1 pushes back 1 s while #2 is out; #2 fails at 0.5: nothing more can go
    script = [(0.375, pushback(UNAVAILABLE, 1.0)), (0.25, UNAVAILABLE)]
    d = run(make_call(hedged(max_attempts=2, delay=0.25)), script)
    assert d.decisions[-1].reason is R.ATTEMPTS_EXHAUSTED  # actual: await-hedges
    assert d.finished_at == 0.5  # actual: 1.375, when the pointless pushback timer fires


def test_buffer_exceeded_while_waiting_for_a_pushback_hedge_ends_the_request():
    script = [(0.125, pushback(UNAVAILABLE, 0.5))]
    d = run(make_call(hedged(max_attempts=3, delay=0.25)), script, events=[(0.25, BUFFER_EXCEEDED)])
    assert (d.finished_at, d.finish.reason) == (0.25, R.BUFFER_EXCEEDED)  # actual: (10.0, deadline)


def test_non_fatal_result_at_the_deadline_sends_no_hedge():
    d = Driver(make_call(hedged(max_attempts=3, delay=5.0), deadline=1.0))
    d(START)
    out = d(AttemptEnded(1, UNAVAILABLE), 1.0)  # the answer is handled before the deadline Tick
    assert not any(isinstance(c, SendAttempt) for c in out)  # actual: SendAttempt(2, timeout=0.0)
    assert out[-1].reason is R.DEADLINE
