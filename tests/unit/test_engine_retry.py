"""The Call state machine in retry mode: one attempt at a time, backoff, pushback, deadline, commit."""

import pytest

from sidecar.policy import (
    BUFFER_EXCEEDED,
    CLIENT_GONE,
    START,
    TICK,
    AttemptEnded,
    BackoffSpec,
    CancelAttempt,
    Committed,
    Decision,
    Finish,
    HedgingSpec,
    Jitter,
    Outcome,
    OutcomeClass,
    Reason,
    RetryPolicy,
    SendAttempt,
    ThrottleKind,
    ThrottleSpec,
    Wake,
)
from tests.unit.playbook import (
    CONNECT,
    FATAL,
    OK,
    RESET,
    TIMEOUT,
    UNAVAILABLE,
    Driver,
    make_call,
    pushback,
    run,
)

C = OutcomeClass
R = Reason
INF = float("inf")
STEPS = BackoffSpec(initial=0.1, max=10.0, multiplier=2.0, jitter=Jitter.NONE)  # 0.1, 0.2, 0.4, ...


def policy(**kw) -> RetryPolicy:
    return RetryPolicy(**{"backoff": STEPS, **kw})


def one_endpoint(p: RetryPolicy, **kw):
    return make_call(p, endpoints=["a"], **kw)


def delays(d: Driver) -> list[float]:
    return [x.delay for x in d.decisions if x.reason is R.RETRY]


# -- the first attempt and how a request ends ------------------------------------------------------------


def test_start_sends_the_first_attempt_with_the_whole_deadline():
    d = Driver(one_endpoint(policy()))
    assert d(START) == [SendAttempt(1, "a", 10.0, True, 0), Wake(10.0)]


def test_first_try_success_finishes():
    d = Driver(one_endpoint(policy()))
    d(START)
    assert d(AttemptEnded(1, OK), 0.5) == [
        Decision(1, "a", C.SUCCESS, R.SUCCESS),
        Finish(R.SUCCESS, 1, OK, 1),
    ]


@pytest.mark.parametrize("max_attempts", [1, 2, 3, 5])
def test_max_attempts_counts_the_first_attempt(max_attempts):
    d = run(make_call(policy(max_attempts=max_attempts)), [UNAVAILABLE] * 9)
    assert [s.attempt for s in d.sends] == list(range(1, max_attempts + 1))
    assert [x.reason for x in d.decisions] == [R.RETRY] * (max_attempts - 1) + [R.ATTEMPTS_EXHAUSTED]
    assert d.finish == Finish(R.ATTEMPTS_EXHAUSTED, max_attempts, UNAVAILABLE, max_attempts)


@pytest.mark.parametrize(("override", "sent"), [(2, 2), (9, 5)])
def test_call_max_attempts_only_narrows_the_policy(override, sent):
    d = run(make_call(policy(max_attempts=5), max_attempts=override), [UNAVAILABLE] * 9)
    assert d.finish.attempts == sent


def test_fatal_answer_is_delivered_without_retry():
    d = run(make_call(policy()), [UNAVAILABLE, FATAL, OK])
    assert d.finish == Finish(R.NOT_RETRYABLE, 2, FATAL, 2)
    assert [x.reason for x in d.decisions] == [R.RETRY, R.NOT_RETRYABLE]


def test_class_outside_retry_on_is_not_retried():
    d = run(make_call(policy()), [TIMEOUT, OK])  # timeout is not in the default retry_on
    assert d.finish == Finish(R.NOT_RETRYABLE, 1, TIMEOUT, 1)


def test_success_after_retries_delivers_the_success():
    d = run(make_call(policy()), [CONNECT, RESET, OK])
    assert d.finish == Finish(R.SUCCESS, 3, OK, 3)
    assert [(x.attempt, x.outcome, x.reason) for x in d.decisions] == [
        (1, C.CONNECT_FAILURE, R.RETRY),
        (2, C.RESET, R.RETRY),
        (3, C.SUCCESS, R.SUCCESS),
    ]


def test_no_endpoint_finishes_without_sending():
    d = Driver(make_call(policy(), candidates=[]))
    assert d(START) == [Finish(R.NO_ENDPOINT, None, None, 0)]


def test_candidates_restrict_the_endpoints():
    d = run(make_call(policy(), candidates=["c"]), [UNAVAILABLE, UNAVAILABLE, OK])
    assert [s.endpoint for s in d.sends] == ["c", "c", "c"]


def test_nothing_happens_after_finish():
    call = make_call(policy())
    run(call, [OK])
    events = [START, TICK, AttemptEnded(1, UNAVAILABLE), Committed(1), BUFFER_EXCEEDED, CLIENT_GONE]
    assert [call.handle(e, 1.0) for e in events] == [[]] * len(events)


# -- backoff -------------------------------------------------------------------------------------------


def test_backoff_follows_the_mongodb_sequence_in_a_call():
    d = run(one_endpoint(policy(max_attempts=6)), [UNAVAILABLE] * 6)
    assert delays(d) == [0.1, 0.2, 0.4, 0.8, 1.6]
    send_times = [t for t, _ in d.timed(SendAttempt)]
    assert send_times == pytest.approx([0.0, 0.1, 0.3, 0.7, 1.5, 3.1], abs=1e-12)


def test_a_wait_is_a_wake_then_the_tick_sends():
    d = Driver(one_endpoint(policy()))
    d(START)
    assert d(AttemptEnded(1, UNAVAILABLE), 0.5) == [Decision(1, "a", C.UNAVAILABLE, R.RETRY, 0.1), Wake(0.6)]
    assert d.tick() == [SendAttempt(2, "a", 10.0 - 0.6, True, 0), Wake(10.0)]


def test_classes_outside_backoff_on_retry_at_once():
    d = Driver(one_endpoint(policy(backoff_on=frozenset({C.UNAVAILABLE}))))
    d(START)
    assert d(AttemptEnded(1, RESET), 0.5) == [
        Decision(1, "a", C.RESET, R.RETRY, 0.0),
        SendAttempt(2, "a", 9.5, True, 0),
    ]


def test_backoff_index_advances_only_on_waits():
    p = policy(max_attempts=6, backoff_on=frozenset({C.UNAVAILABLE}))
    d = run(one_endpoint(p), [UNAVAILABLE, RESET, UNAVAILABLE, RESET, UNAVAILABLE, OK])
    assert delays(d) == [0.1, 0.0, 0.2, 0.0, 0.4]


# -- pushback ------------------------------------------------------------------------------------------


def test_pushback_overrides_the_delay_and_restarts_backoff():
    script = [UNAVAILABLE, UNAVAILABLE, pushback(UNAVAILABLE, 0.5), UNAVAILABLE, UNAVAILABLE, OK]
    d = run(one_endpoint(policy(max_attempts=6)), script)
    assert delays(d) == [0.1, 0.2, 0.5, 0.1, 0.2]
    assert d.finish.reason is R.SUCCESS


def test_pushback_delays_even_classes_that_do_not_back_off():
    d = run(one_endpoint(policy(backoff_on=frozenset())), [pushback(RESET, 0.25), OK])
    assert delays(d) == [0.25]
    assert [t for t, _ in d.timed(SendAttempt)] == [0.0, 0.25]


def test_pushback_stop_ends_the_request():
    stop = pushback(UNAVAILABLE, None)
    d = run(one_endpoint(policy()), [stop, OK])
    assert d.decisions == [Decision(1, "a", C.UNAVAILABLE, R.PUSHBACK_NO_RETRY)]
    assert d.finish == Finish(R.PUSHBACK_NO_RETRY, 1, stop, 1)


def test_pushback_is_ignored_when_the_policy_says_so():
    script = [pushback(UNAVAILABLE, None), pushback(UNAVAILABLE, 5.0), OK]
    d = run(one_endpoint(policy(pushback=False)), script)
    assert delays(d) == [0.1, 0.2]
    assert d.finish.reason is R.SUCCESS


def test_server_backoff_base_replaces_initial():
    script = [UNAVAILABLE, Outcome(C.UNAVAILABLE, backoff_base=0.5), UNAVAILABLE, OK]
    d = run(one_endpoint(policy(max_attempts=4)), script)
    assert delays(d) == [0.1, 1.0, 2.0]  # i=1 and i=2 on base 0.5


# -- deadline ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("start", [10.0, 12.0])
def test_start_at_or_after_the_deadline_sends_nothing(start):
    d = Driver(make_call(policy()), now=start)
    assert d(START) == [Finish(R.DEADLINE, None, None, 0)]


@pytest.mark.parametrize(
    ("per_try", "start", "timeout", "whole"),
    [(INF, 0.0, 10.0, True), (0.25, 0.0, 0.25, False), (4.0, 8.0, 2.0, True), (2.0, 8.0, 2.0, True)],
)
def test_attempt_timeout_is_per_try_or_the_remaining_deadline(per_try, start, timeout, whole):
    d = Driver(one_endpoint(policy(per_try_timeout=per_try)), now=start)
    (send,) = [c for c in d(START) if isinstance(c, SendAttempt)]
    assert (send.timeout, send.whole_deadline) == (timeout, whole)


def test_per_try_timeout_cancels_the_attempt_and_decides_timeout():
    d = Driver(one_endpoint(policy(per_try_timeout=0.25)))
    assert d(START) == [SendAttempt(1, "a", 0.25, False, 0), Wake(0.25)]
    cancel, decision, finish = d.tick()
    assert cancel == CancelAttempt(1, R.PER_TRY_TIMEOUT)
    assert decision == Decision(1, "a", C.TIMEOUT, R.NOT_RETRYABLE)
    assert (finish.reason, finish.attempt, finish.outcome.cls) == (R.NOT_RETRYABLE, 1, C.TIMEOUT)


def test_per_try_timeout_is_retried_when_timeout_is_retryable():
    p = policy(per_try_timeout=0.25, retry_on=frozenset({C.TIMEOUT}))
    d = run(one_endpoint(p), [(0.5, OK), (0.125, OK)])  # attempt 1 answers after its timeout: too late
    assert d.cancels == [CancelAttempt(1, R.PER_TRY_TIMEOUT)]
    assert d.decisions[0] == Decision(1, "a", C.TIMEOUT, R.RETRY, 0.1)
    assert [t for t, _ in d.timed(SendAttempt)] == [0.0, 0.35]
    assert d.finish == Finish(R.SUCCESS, 2, OK, 2)


def test_deadline_during_an_attempt_cancels_it():
    d = run(make_call(policy(), deadline=1.0), [None])
    assert d.log[-2:] == [(1.0, CancelAttempt(1, R.DEADLINE)), (1.0, Finish(R.DEADLINE, None, None, 1))]
    assert d.decisions == []


@pytest.mark.parametrize(
    ("deadline", "answer"),
    [
        (0.1, UNAVAILABLE),  # backoff 0.1 would reach the deadline
        (0.05, UNAVAILABLE),  # ... or cross it
        (1.0, pushback(UNAVAILABLE, 1.0)),  # pushback would reach it
    ],
    ids=["backoff-reaches", "backoff-crosses", "pushback-reaches"],
)
def test_a_wait_that_reaches_the_deadline_ends_now_without_spending_a_token(deadline, answer):
    p = policy(throttle=ThrottleSpec(ThrottleKind.MONGODB))
    call = one_endpoint(p, deadline=deadline)
    d = Driver(call)
    d(START)
    assert d(AttemptEnded(1, answer)) == [
        Decision(1, "a", C.UNAVAILABLE, R.DEADLINE),
        Finish(R.DEADLINE, 1, answer, 1),
    ]
    assert call.throttle.tokens == 1000.0


def test_an_answer_at_the_deadline_is_not_retried():
    d = Driver(one_endpoint(policy(backoff_on=frozenset()), deadline=1.0))
    d(START)
    out = d(AttemptEnded(1, UNAVAILABLE), 1.0)
    assert not any(isinstance(c, SendAttempt) for c in out)
    assert out[-1].reason is R.DEADLINE


def test_transparent_retry_at_the_deadline_sends_nothing():
    d = Driver(one_endpoint(policy(transparent_retry=True), deadline=1.0))
    d(START)
    out = d(AttemptEnded(1, CONNECT), 1.0)  # the answer is handled before the deadline Tick
    assert not any(isinstance(c, SendAttempt) for c in out)  # actual: SendAttempt(2, timeout=0.0)
    assert out[-1].reason is R.DEADLINE


def test_upstream_deadline_expired_with_the_whole_deadline_ends_the_request():
    expired = Outcome(C.UNAVAILABLE, deadline_expired=True)
    d = run(one_endpoint(policy()), [expired, OK])
    assert d.decisions == [Decision(1, "a", C.TIMEOUT, R.DEADLINE)]
    assert (d.finish.reason, d.finish.attempts) == (R.DEADLINE, 1)


@pytest.mark.parametrize(
    ("retry_on", "reasons"),
    [
        (frozenset({C.UNAVAILABLE}), [R.NOT_RETRYABLE]),
        (frozenset({C.UNAVAILABLE, C.TIMEOUT}), [R.RETRY, R.SUCCESS]),
    ],
    ids=["timeout-not-retryable", "timeout-retryable"],
)
def test_upstream_deadline_expired_under_a_per_try_timeout_is_a_timeout(retry_on, reasons):
    expired = Outcome(C.UNAVAILABLE, deadline_expired=True)
    d = run(one_endpoint(policy(per_try_timeout=0.25, retry_on=retry_on)), [expired, OK])
    assert d.decisions[0].outcome is C.TIMEOUT
    assert [x.reason for x in d.decisions] == reasons


# -- what the request allows: retry_on override, replay buffer, commit, client ----------------------------


def test_narrowed_retry_on_retries_only_those_classes():
    post = frozenset({C.CONNECT_FAILURE})
    assert run(make_call(policy(), retry_on=post), [UNAVAILABLE, OK]).finish.reason is R.NOT_RETRYABLE
    d = run(make_call(policy(), retry_on=post), [CONNECT, OK])
    assert (d.finish.reason, d.finish.attempts) == (R.SUCCESS, 2)


def test_narrowed_call_never_hedges():
    p = policy(hedging=HedgingSpec(max_attempts=3, delay=0.05))
    d = Driver(make_call(p, retry_on=frozenset({C.CONNECT_FAILURE}), endpoints=["a"]))
    assert d(START) == [SendAttempt(1, "a", 10.0, True, 0), Wake(10.0)]  # no hedge timer
    d(AttemptEnded(1, CONNECT), 0.5)
    d.tick()
    assert d.sends[1].hedge == 0  # a retry, not a hedge


def test_unreplayable_request_gets_exactly_one_attempt():
    d = run(make_call(policy(), replayable=False), [UNAVAILABLE, OK])
    assert [x.reason for x in d.decisions] == [R.BUFFER_EXCEEDED]
    assert d.finish == Finish(R.BUFFER_EXCEEDED, 1, UNAVAILABLE, 1)


def test_buffer_exceeded_mid_attempt_allows_no_further_attempt():
    d = run(make_call(policy()), [(1.0, UNAVAILABLE), OK], events=[(0.5, BUFFER_EXCEEDED)])
    assert d.finish == Finish(R.BUFFER_EXCEEDED, 1, UNAVAILABLE, 1)


def test_buffer_exceeded_mid_attempt_still_delivers_a_success():
    d = run(make_call(policy()), [(1.0, OK)], events=[(0.5, BUFFER_EXCEEDED)])
    assert d.finish == Finish(R.SUCCESS, 1, OK, 1)


def test_buffer_exceeded_during_a_backoff_wait_ends_the_request():
    p = policy(backoff=BackoffSpec(initial=1.0, jitter=Jitter.NONE))
    d = run(make_call(p), [UNAVAILABLE, OK], events=[(0.5, BUFFER_EXCEEDED)])
    assert (d.finished_at, d.finish) == (0.5, Finish(R.BUFFER_EXCEEDED, 1, UNAVAILABLE, 1))


@pytest.mark.parametrize(
    ("answer", "finish"),
    [(RESET, Finish(R.COMMITTED, 2, RESET, 2)), (OK, Finish(R.SUCCESS, 2, OK, 2))],
    ids=["failure", "success"],
)
def test_committed_attempt_is_the_one_delivered(answer, finish):
    d = run(make_call(policy()), [UNAVAILABLE, (1.0, answer)], events=[(0.5, Committed(2))])
    assert d.finish == finish
    assert d.decisions[-1].reason is finish.reason


def test_prefer_previous_delivers_the_earlier_answer():
    d = run(make_call(policy(max_attempts=2)), [UNAVAILABLE, Outcome(C.RESET, prefer_previous=True)])
    assert d.finish == Finish(R.ATTEMPTS_EXHAUSTED, 1, UNAVAILABLE, 2)


def test_committed_attempt_is_delivered_even_if_it_prefers_previous():
    answer = Outcome(C.RESET, prefer_previous=True)
    d = run(make_call(policy()), [UNAVAILABLE, (1.0, answer)], events=[(0.5, Committed(2))])
    assert d.finish == Finish(R.COMMITTED, 2, answer, 2)  # actual: attempt 1, though 2 is half-sent


def test_client_gone_mid_attempt_cancels_it():
    d = Driver(make_call(policy(), endpoints=["a"]))
    d(START)
    assert d(CLIENT_GONE, 0.5) == [CancelAttempt(1, R.CANCELLED), Finish(R.CANCELLED, None, None, 1)]


def test_client_gone_during_a_backoff_wait_just_finishes():
    d = Driver(make_call(policy(), endpoints=["a"]))
    d(START)
    d(AttemptEnded(1, UNAVAILABLE))
    assert d(CLIENT_GONE, 0.05) == [Finish(R.CANCELLED, None, None, 1)]


# -- transparent retry ----------------------------------------------------------------------------------


def test_transparent_retry_is_immediate_and_leaves_backoff_alone():
    d = Driver(one_endpoint(policy(transparent_retry=True)))
    d(START)
    assert d(AttemptEnded(1, CONNECT), 0.5) == [
        Decision(1, "a", C.CONNECT_FAILURE, R.TRANSPARENT_RETRY),
        SendAttempt(2, "a", 9.5, True, 0),
    ]
    d(AttemptEnded(2, UNAVAILABLE), 0.5)
    assert d.decisions[-1] == Decision(2, "a", C.UNAVAILABLE, R.RETRY, 0.1)  # i=0: the first wait


def test_without_transparent_retry_a_connect_failure_backs_off():
    d = run(one_endpoint(policy()), [CONNECT, OK])
    assert [(x.reason, x.delay) for x in d.decisions] == [(R.RETRY, 0.1), (R.SUCCESS, 0.0)]
