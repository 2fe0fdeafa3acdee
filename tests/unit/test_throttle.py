"""Retry budgets: gRPC A6 token throttling and MongoDB's client-backpressure bucket, alone and in a Call."""

import pytest

from sidecar.policy import (
    BackoffSpec,
    GrpcThrottle,
    Jitter,
    MongoThrottle,
    Outcome,
    OutcomeClass,
    Reason,
    RetryPolicy,
    ThrottleKind,
    ThrottleSpec,
    make_throttle,
)
from tests.unit.playbook import CONNECT, OK, OVERLOADED, UNAVAILABLE, make_call, pushback, run

C = OutcomeClass
A6 = ThrottleSpec(ThrottleKind.GRPC, max_tokens=10, token_ratio=0.5)
MONGO = ThrottleSpec(ThrottleKind.MONGODB)
QUICK = BackoffSpec(initial=0.01, max=0.01, jitter=Jitter.NONE)


def test_make_throttle_builds_the_kind_asked_for():
    assert isinstance(make_throttle(A6), GrpcThrottle)
    assert isinstance(make_throttle(MONGO), MongoThrottle)


# -- gRPC A6 --------------------------------------------------------------------------------------------


def test_grpc_a6_token_table():
    t = GrpcThrottle(A6)
    assert (t.tokens, t.acquire()) == (10.0, True)
    steps = [
        # (result, tokens after, retry allowed)
        ("fail", 9.0, True),
        ("fail", 8.0, True),
        ("fail", 7.0, True),
        ("fail", 6.0, True),
        ("fail", 5.0, False),  # 5 <= 10/2
        ("ok", 5.5, True),
        ("fail", 4.5, False),
        ("ok", 5.0, False),
        ("ok", 5.5, True),
        ("fail", 4.5, False),
        ("fail", 3.5, False),
        ("ok", 4.0, False),
    ]
    for result, tokens, allowed in steps:
        if result == "ok":
            t.on_success(retry=False)
        else:
            t.on_failure(retry=False, counted=True, overloaded=False)
        assert (t.tokens, t.acquire()) == (tokens, allowed)


def test_grpc_bucket_drains_across_requests():
    """Always-unavailable upstream, max_attempts 3: attempts per request shrink as the bucket empties."""
    bucket = make_throttle(A6)
    policy = RetryPolicy(max_attempts=3, throttle=A6, backoff=QUICK)
    attempts, tokens, reasons = [], [], []
    for _ in range(9):
        d = run(make_call(policy, throttle=bucket), [UNAVAILABLE] * 3)
        attempts.append(d.finish.attempts)
        tokens.append(bucket.tokens)
        reasons.append(d.finish.reason)
    assert attempts == [3, 2, 1, 1, 1, 1, 1, 1, 1]
    assert tokens == [7.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0, 0.0, 0.0]
    assert reasons == [Reason.ATTEMPTS_EXHAUSTED] + [Reason.THROTTLED] * 8


def test_grpc_bucket_recovers_with_successes():
    bucket = make_throttle(A6)
    bucket.tokens = 5.0
    policy = RetryPolicy(max_attempts=3, throttle=A6, backoff=QUICK)
    assert run(make_call(policy, throttle=bucket), [OK]).finish.reason is Reason.SUCCESS
    assert bucket.tokens == 5.5
    d = run(make_call(policy, throttle=bucket), [UNAVAILABLE, OK])  # 4.5 after the failure: no retry
    assert (d.finish.reason, d.finish.attempts, bucket.tokens) == (Reason.THROTTLED, 1, 4.5)


def test_grpc_counts_only_retryable_classes_and_pushback_stop():
    bucket = make_throttle(A6)
    policy = RetryPolicy(max_attempts=1, throttle=A6, retry_on=frozenset({C.UNAVAILABLE}))
    run(make_call(policy, throttle=bucket), [OVERLOADED])  # not in retry_on: not a failure to count
    assert bucket.tokens == 10.0
    run(make_call(policy, throttle=bucket), [UNAVAILABLE])
    assert bucket.tokens == 9.0
    d = run(make_call(policy, throttle=bucket), [pushback(OVERLOADED, None)])
    assert (d.finish.reason, bucket.tokens) == (Reason.NOT_RETRYABLE, 8.0)


def test_transparent_retry_skips_the_grpc_bucket():
    bucket = make_throttle(A6)
    bucket.tokens = 5.0  # at half: no ordinary retry would be allowed
    policy = RetryPolicy(transparent_retry=True, throttle=A6, backoff=QUICK)
    d = run(make_call(policy, throttle=bucket), [CONNECT, OK])
    assert [x.reason for x in d.decisions] == [Reason.TRANSPARENT_RETRY, Reason.SUCCESS]
    assert bucket.tokens == 5.5  # the connect failure was not charged; the success was credited


def test_transparent_retry_is_only_the_first_connect_failure():
    bucket = make_throttle(A6)
    policy = RetryPolicy(transparent_retry=True, throttle=A6, backoff=QUICK)
    d = run(make_call(policy, throttle=bucket), [CONNECT, CONNECT, OK])
    assert [x.reason for x in d.decisions] == [Reason.TRANSPARENT_RETRY, Reason.RETRY, Reason.SUCCESS]
    assert bucket.tokens == 9.5  # 10, not charged, -1, +0.5


# -- MongoDB client backpressure ---------------------------------------------------------------------


def test_mongo_bucket_starts_full_and_a_retry_costs_one():
    t = MongoThrottle(MONGO)
    assert t.tokens == 1000.0
    assert t.acquire()
    assert t.tokens == 999.0


def test_mongo_refuses_when_less_than_a_retry_is_left():
    t = MongoThrottle(ThrottleSpec(ThrottleKind.MONGODB, capacity=2))
    t.tokens = 0.5
    assert not t.acquire()
    assert t.tokens == 0.5


@pytest.mark.parametrize(
    ("result", "deposit"),
    [
        (lambda t: t.on_success(retry=False), 0.1),
        (lambda t: t.on_success(retry=True), 1.1),
        (lambda t: t.on_failure(retry=True, counted=True, overloaded=False), 1.0),
        (lambda t: t.on_failure(retry=True, counted=True, overloaded=True), 0.0),
        (lambda t: t.on_failure(retry=False, counted=True, overloaded=False), 0.0),
    ],
    ids=["first-try-success", "success-after-retry", "retry-failed", "retry-overloaded", "first-try-failed"],
)
def test_mongo_deposits(result, deposit):
    t = MongoThrottle(MONGO)
    t.tokens = 500.0
    result(t)
    assert t.tokens == pytest.approx(500.0 + deposit, abs=1e-9)


def test_mongo_small_bucket_stops_an_overload_storm_after_three_attempts():
    bucket = make_throttle(ThrottleSpec(ThrottleKind.MONGODB, capacity=2))
    policy = RetryPolicy(max_attempts=6, throttle=bucket.spec, backoff=QUICK)
    d = run(make_call(policy, throttle=bucket), [OVERLOADED] * 6)
    assert (d.finish.reason, d.finish.attempts, bucket.tokens) == (Reason.THROTTLED, 3, 0.0)
    assert [x.reason for x in d.decisions] == [Reason.RETRY, Reason.RETRY, Reason.THROTTLED]


@pytest.mark.parametrize(
    ("script", "tokens"),
    [
        ([OK], 500.1),  # first-try success: +0.1
        ([UNAVAILABLE, OK], 500.1),  # -1 for the retry, +1.1 for its success
        ([UNAVAILABLE] * 3, 500.0),  # two retries, each -1 then +1 as it failed without overload
        ([OVERLOADED] * 3, 498.0),  # two retries, no refunds
    ],
    ids=["first-try-success", "retry-success", "retries-fail", "retries-overloaded"],
)
def test_mongo_bucket_through_a_call(script, tokens):
    bucket = make_throttle(MONGO)
    bucket.tokens = 500.0
    run(make_call(RetryPolicy(max_attempts=3, throttle=MONGO, backoff=QUICK), throttle=bucket), script)
    assert bucket.tokens == pytest.approx(tokens, abs=1e-9)


def test_transparent_retry_earns_no_mongo_refund():
    bucket = make_throttle(MONGO)
    bucket.tokens = 500.0
    policy = RetryPolicy(transparent_retry=True, throttle=MONGO)
    d = run(make_call(policy, throttle=bucket), [CONNECT, OK])
    assert d.decisions[0].reason is Reason.TRANSPARENT_RETRY
    assert bucket.tokens == pytest.approx(500.1, abs=1e-9)  # as for any success nobody paid a retry for


def test_an_overload_signal_on_another_class_earns_no_mongo_refund():
    # A SystemOverloadedError that is not retryable (fatal), or a connection an ingress limiter refused:
    # the spec deposits 1 only for failures without the overload label.
    bucket = make_throttle(MONGO)
    bucket.tokens = 500.0
    policy = RetryPolicy(max_attempts=3, throttle=MONGO, backoff=QUICK)
    overloaded_refusal = Outcome(OutcomeClass.CONNECT_FAILURE, overload=True)
    lone_label = Outcome(OutcomeClass.FATAL, overload=True)
    d = run(make_call(policy, throttle=bucket), [UNAVAILABLE, overloaded_refusal, lone_label])
    assert d.finish.reason is Reason.NOT_RETRYABLE and d.finish.attempts == 3
    assert bucket.tokens == pytest.approx(498.0, abs=1e-9)  # two retries paid, nothing refunded
