"""Invariants over random policies and random upstream behaviour (hypothesis, derandomized)."""

import math
import random

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sidecar.policy import (
    BUFFER_EXCEEDED,
    CLIENT_GONE,
    PUSHBACK_STOP,
    TICK,
    AttemptEnded,
    BackoffSpec,
    CancelAttempt,
    Committed,
    Decision,
    Finish,
    GrpcThrottle,
    HedgingSpec,
    Jitter,
    MongoThrottle,
    Outcome,
    OutcomeClass,
    Pushback,
    Reason,
    RetryPolicy,
    SendAttempt,
    ThrottleKind,
    ThrottleSpec,
    Wake,
    make_throttle,
)
from sidecar.policy.backoff import BackoffSequence
from tests.unit.playbook import Driver, StrictBalancer, make_call, run

C = OutcomeClass
FAST = settings(  # the same 200 examples every run, nothing remembered between runs
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Interesting values first: hypothesis leans towards the first of a choice.
RETRYABLE = [C.UNAVAILABLE, C.OVERLOADED, C.CONNECT_FAILURE, C.RESET, C.TIMEOUT]
ANY_CLASS = [*RETRYABLE[:3], C.SUCCESS, *RETRYABLE[3:], C.FATAL]
classes = st.frozensets(st.sampled_from(RETRYABLE))
some_classes = st.frozensets(st.sampled_from(RETRYABLE), min_size=1)
seconds = st.sampled_from([0.05, 0.25, 0.01, 1.0, 0.0, 4.0])

throttles = (
    st.none()
    | st.builds(
        ThrottleSpec,
        kind=st.just(ThrottleKind.GRPC),
        max_tokens=st.sampled_from([3.0, 10.0]),
        token_ratio=st.sampled_from([0.1, 0.5, 1.0]),
    )
    | st.builds(
        ThrottleSpec,
        kind=st.just(ThrottleKind.MONGODB),
        capacity=st.sampled_from([1.0, 2.0, 5.0, 1000.0]),
        retry_cost=st.sampled_from([0.5, 1.0]),
        return_rate=st.sampled_from([0.1, 1.0]),
    )
)

hedgings = st.none() | st.builds(
    HedgingSpec, max_attempts=st.integers(1, 4), delay=seconds, non_fatal=some_classes
)
policies = st.builds(
    RetryPolicy,
    max_attempts=st.integers(1, 6),
    retry_on=some_classes,
    backoff_on=classes,
    backoff=st.builds(
        BackoffSpec,
        initial=st.sampled_from([0.0, 0.01, 0.1, 0.5]),
        max=st.sampled_from([0.05, 1.0, 10.0]),
        multiplier=st.sampled_from([1.0, 1.5, 2.0, 3.0]),
        jitter=st.sampled_from(Jitter),
    ),
    per_try_timeout=st.sampled_from([math.inf, 0.1, 0.3, 1.0]),
    pushback=st.booleans(),
    throttle=throttles,
    hedging=hedgings,
    transparent_retry=st.booleans(),
    deprioritize_overloaded=st.booleans(),
)

outcomes = st.builds(
    Outcome,
    cls=st.sampled_from(ANY_CLASS),
    pushback=st.sampled_from(
        [None] * 8 + [PUSHBACK_STOP, Pushback(0.0), Pushback(0.05), Pushback(0.3), Pushback(4.0)]
    ),
    deadline_expired=st.sampled_from([False] * 7 + [True]),
    backoff_base=st.sampled_from([None, None, 0.02, 0.3]),
    prefer_previous=st.booleans(),
).map(lambda o: o._replace(prefer_previous=False) if o.ok else o)  # an error label (NoWritesPerformed)
steps = st.builds(  # answers after a while, or (None) never
    lambda after, outcome: None if after is None else (after, outcome),
    st.sampled_from([0.05, 0.25, 0.01, 1.0, 0.0, 4.0, None]),
    outcomes,
)
events = st.tuples(
    st.sampled_from([0.2, 0.02, 0.6, 2.0, 0.0]),
    st.sampled_from([Committed(2), BUFFER_EXCEEDED, Committed(1), CLIENT_GONE, Committed(3)]),
)
requests = st.fixed_dictionaries(
    {
        "script": st.lists(steps, min_size=1, max_size=8),
        "events": st.lists(events, max_size=1),
        "start": st.sampled_from([0.0, 3.0]),
        "budget": st.sampled_from([3.0, 1.0, 0.3] * 4 + [0.0, -1.0]),  # deadline - start; rarely none left
        "retry_on": st.none() | st.none() | some_classes,
        "max_attempts": st.none() | st.integers(1, 6),
        "replayable": st.sampled_from([True, True, True, False]),
        "candidates": st.sampled_from([None] * 6 + [["b", "c"], ["a"], []]),
        "seed": st.integers(0, 2**16),
    }
)


def check_one_call(d: Driver, policy: RetryPolicy, req: dict) -> None:
    call = d.call
    deadline = call.deadline
    hedging = policy.hedging if req["retry_on"] is None else None  # a narrowed request never hedges
    # attempts: numbered 1..k, never more than allowed, never at or past the deadline
    limit = hedging.max_attempts if hedging else policy.max_attempts
    limit = min(limit, req["max_attempts"] or limit, 1 if not req["replayable"] else limit)
    sends = d.timed(SendAttempt)
    assert len(sends) <= limit
    assert [s.attempt for _, s in sends] == list(range(1, len(sends) + 1))
    for t, s in sends:
        assert t < deadline
        assert 0 < s.timeout <= deadline - t
        assert s.timeout <= policy.per_try_timeout
        assert s.whole_deadline == (s.timeout == deadline - t)
        assert s.hedge == (s.attempt - 1 if hedging else 0)
    # waits: strictly ahead, never past the deadline
    for t, w in d.timed(Wake):
        assert t < w.at <= deadline
    for t, x in d.timed(Decision):
        assert x.delay == 0 or t + x.delay < deadline
    # one Finish, last, accounting for every attempt sent
    (finish,) = d.all(Finish)
    assert d.log[-1][1] is finish
    assert finish.attempts == len(sends)
    assert finish.attempt is None or 1 <= finish.attempt <= len(sends)
    assert (finish.reason is Reason.SUCCESS) == (finish.outcome is not None and finish.outcome.ok)
    # one Decision per attempt that ended (an accepted answer or a per-try timeout), none for cancelled ones;
    # nothing is sent once the body outgrew the buffer or a response was committed
    live, accepted, timed_out, decided, closed = set(), 0, 0, [], False
    for _, x in d.log:
        if isinstance(x, SendAttempt):
            assert not closed
            live.add(x.attempt)
        elif x is BUFFER_EXCEEDED or (isinstance(x, Committed) and x.attempt in live):
            closed = True
        elif isinstance(x, AttemptEnded) and x.attempt in live:
            accepted += 1
        elif isinstance(x, CancelAttempt):
            assert x.attempt in live
            live.discard(x.attempt)
            timed_out += x.reason is Reason.PER_TRY_TIMEOUT
        elif isinstance(x, Decision):
            decided.append(x.attempt)
            live.discard(x.attempt)
    assert len(decided) == len(set(decided)) == accepted + timed_out
    assert live == set()
    # and then silence
    assert call.handle(TICK, deadline + 1) == []


@FAST
@given(policy=policies, endpoints=st.integers(1, 3), reqs=st.lists(requests, min_size=1, max_size=3))
def test_any_policy_any_upstream(policy, endpoints, reqs):
    balancer = StrictBalancer(["a", "b", "c"][:endpoints], cooldown=1.0)
    throttle = make_throttle(policy.throttle) if policy.throttle else None
    for req in reqs:
        call = make_call(
            policy,
            balancer=balancer,
            throttle=throttle,
            rand=random.Random(req["seed"]).random,
            deadline=req["start"] + req["budget"],
            retry_on=req["retry_on"],
            max_attempts=req["max_attempts"],
            replayable=req["replayable"],
            candidates=req["candidates"],
        )
        events = [(req["start"] + t, e) for t, e in req["events"]]
        d = run(call, req["script"], now=req["start"], events=events)
        check_one_call(d, policy, req)
        event(f"{'hedging' if call.hedging else 'retry'}: {d.finish.reason}, {d.finish.attempts} sent")
        assert all(n == 0 for n in balancer.outstanding.values())
        if throttle is not None:
            assert 0 <= throttle.tokens <= throttle.capacity


@FAST
@given(
    initial=st.floats(0, 100),
    max_=st.floats(0, 1000),
    multiplier=st.floats(1, 10),
)
def test_backoff_matches_the_grpc_a6_recurrence(initial, max_, multiplier):
    seq = BackoffSequence(BackoffSpec(initial=initial, max=max_, multiplier=multiplier, jitter=Jitter.NONE))
    current = min(initial, max_)
    for _ in range(30):
        assert seq.next(random.random) == current
        current = min(current * multiplier, max_)


@FAST
@given(
    spec=throttles.filter(lambda s: s is not None),
    ops=st.lists(st.tuples(st.sampled_from(["ok", "fail", "acquire"]), st.booleans(), st.booleans())),
)
def test_buckets_stay_between_zero_and_capacity(spec, ops):
    bucket = make_throttle(spec)
    assert isinstance(bucket, GrpcThrottle | MongoThrottle)
    for op, retry, flag in ops:
        if op == "ok":
            bucket.on_success(retry)
        elif op == "fail":
            bucket.on_failure(retry, counted=flag, overloaded=not flag)
        else:
            before = bucket.tokens
            allowed = bucket.acquire()
            if isinstance(bucket, GrpcThrottle):
                assert (allowed, bucket.tokens) == (before > spec.max_tokens / 2, before)
            else:
                assert bucket.tokens == (before - spec.retry_cost if allowed else before)
        assert 0 <= bucket.tokens <= bucket.capacity
