"""Outlier detection on a clock moved by hand: consecutive failures eject, time and a probe return, the
ejection grows with each ejection, max_ejection_percent holds; the balancer and the engine around it."""

from __future__ import annotations

import random

import pytest

from sidecar.policy import (
    START,
    AttemptEnded,
    OutcomeClass,
    RetryPolicy,
    SendAttempt,
    ThrottleKind,
    ThrottleSpec,
)
from sidecar.policy import Reason as R
from sidecar.upstream.balancer import Balancer
from sidecar.upstream.outlier import (
    CONNECT_FAILURES,
    ERRORS,
    PROBE_FAILED,
    TIMEOUTS,
    OutlierDetector,
    OutlierSpec,
)
from tests.unit.playbook import CONNECT, OK, Driver, make_call, run

C = OutcomeClass
SPEC = OutlierSpec(
    consecutive_connect_failures=3,
    consecutive_errors=5,
    consecutive_timeouts=4,
    base_ejection_time=5.0,
    max_ejection_time=12.0,
    max_ejection_percent=50.0,
)


def detector() -> OutlierDetector:
    return OutlierDetector(SPEC)


def fail(od: OutlierDetector, endpoint: str, cls: OutcomeClass, times: int, now: float = 0.0) -> None:
    for _ in range(times):
        od.observe(endpoint, cls, now, 2)


# -- the detector alone -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "threshold", "reason"),
    [
        (C.CONNECT_FAILURE, 3, CONNECT_FAILURES),
        (C.UNAVAILABLE, 5, ERRORS),
        (C.OVERLOADED, 5, ERRORS),
        (C.RESET, 5, ERRORS),
        (C.TIMEOUT, 4, TIMEOUTS),
    ],
)
def test_consecutive_failures_of_a_kind_eject_at_their_threshold(cls, threshold, reason):
    od = detector()
    fail(od, "a", cls, threshold - 1)
    assert not od.is_ejected("a")
    fail(od, "a", cls, 1)
    assert od.is_ejected("a") and od.ejections == {reason: 1}


@pytest.mark.parametrize("answer", [C.SUCCESS, C.FATAL])
def test_an_answer_in_between_resets_the_count(answer):
    od = detector()
    fail(od, "a", C.CONNECT_FAILURE, 2)
    od.observe("a", answer, 0.0, 2)
    fail(od, "a", C.CONNECT_FAILURE, 2)
    assert not od.is_ejected("a")


def test_failures_of_other_endpoints_do_not_add_up():
    od = OutlierDetector(OutlierSpec(max_ejection_percent=100.0))
    for e in ("a", "b", "a", "b"):
        od.observe(e, C.CONNECT_FAILURE, 0.0, 3)
    assert not od.ejected


def test_an_ejected_endpoint_returns_by_a_probe_after_its_time():
    od = detector()
    fail(od, "a", C.CONNECT_FAILURE, 3, now=1.0)
    assert od.probe(5.9, ["a", "b"]) is None  # ejected for 5 s, from t=1
    assert od.probe(6.0, ["a", "b"]) == "a"
    assert od.probe(6.0, ["a", "b"]) is None  # one probe at a time
    assert od.is_ejected("a")  # still out while the probe is in flight
    od.observe("a", C.SUCCESS, 6.1, 2)
    assert not od.is_ejected("a")


def test_a_failed_probe_ejects_again_for_longer_capped():
    od = detector()
    fail(od, "a", C.CONNECT_FAILURE, 3, now=0.0)
    assert od.probe(5.0, ["a"]) == "a"
    od.observe("a", C.CONNECT_FAILURE, 5.0, 2)  # ejected a second time: 2 x 5 s
    assert od.ejections == {CONNECT_FAILURES: 1, PROBE_FAILED: 1}
    assert od.probe(14.9, ["a"]) is None and od.probe(15.0, ["a"]) == "a"
    od.observe("a", C.TIMEOUT, 15.0, 2)  # a third time: 15 s, capped at max_ejection_time (12 s)
    assert od.probe(26.9, ["a"]) is None and od.probe(27.0, ["a"]) == "a"


def test_a_probe_that_never_reports_is_given_up_after_the_base_time():
    od = detector()
    fail(od, "a", C.CONNECT_FAILURE, 3, now=0.0)
    assert od.probe(5.0, ["a"]) == "a"  # its attempt is cancelled: no result ever comes
    assert od.probe(9.9, ["a"]) is None
    assert od.probe(10.0, ["a"]) == "a"


def test_results_of_attempts_sent_before_the_ejection_are_ignored():
    od = detector()
    fail(od, "a", C.CONNECT_FAILURE, 3)
    od.observe("a", C.SUCCESS, 0.5, 2)
    fail(od, "a", C.CONNECT_FAILURE, 5, now=0.5)
    assert od.is_ejected("a") and od.ejections == {CONNECT_FAILURES: 1}
    assert od.probe(5.0, ["a"]) == "a"  # the ejection time did not grow either


def test_the_multiplier_starts_again_after_a_long_healthy_stay():
    od = detector()
    fail(od, "a", C.CONNECT_FAILURE, 3, now=0.0)
    od.probe(5.0, ["a"])
    od.observe("a", C.SUCCESS, 5.0, 2)  # back at t=5 after one ejection
    fail(od, "a", C.CONNECT_FAILURE, 3, now=6.0)  # soon ejected again: 2 x 5 s
    assert od.probe(15.9, ["a"]) is None and od.probe(16.0, ["a"]) == "a"
    od.observe("a", C.SUCCESS, 16.0, 2)
    fail(od, "a", C.CONNECT_FAILURE, 3, now=16.0 + 12.0)  # healthy for max_ejection_time: 5 s again
    assert od.probe(32.9, ["a"]) is None and od.probe(33.0, ["a"]) == "a"


@pytest.mark.parametrize(
    ("total", "percent", "most"),
    [(1, 100.0, 0), (2, 50.0, 1), (2, 100.0, 1), (3, 50.0, 1), (4, 50.0, 2), (10, 10.0, 1), (10, 0.0, 1)],
)
def test_max_ejection_percent_with_at_least_one_and_never_the_last(total, percent, most):
    od = OutlierDetector(OutlierSpec(max_ejection_percent=percent))
    endpoints = [f"e{i}" for i in range(total)]
    for e in endpoints:
        for _ in range(3):
            od.observe(e, C.CONNECT_FAILURE, 0.0, total)
    assert len(od.ejected) == most


# -- the balancer -----------------------------------------------------------------------------------------


def test_an_ejected_endpoint_gets_no_first_attempts_then_one_probe():
    b = Balancer(["a", "b"], outliers=SPEC)
    for _ in range(3):
        b.observe("a", C.CONNECT_FAILURE, 0.0)
    picks = {b.pick(1.0, random.Random(s).random) for s in range(50)}
    assert picks == {"b"}
    assert b.pick(5.0, random.Random(1).random) == "a"  # the probe
    assert {b.pick(5.0, random.Random(s).random) for s in range(50)} == {"b"}
    b.observe("a", C.SUCCESS, 5.1)
    assert {b.pick(5.2, random.Random(s).random) for s in range(50)} == {"a", "b"}


def test_a_retry_is_no_probe():
    b = Balancer(["a", "b"], outliers=SPEC)
    for _ in range(3):
        b.observe("a", C.CONNECT_FAILURE, 0.0)
    assert b.pick(6.0, random.Random(1).random, avoid={"b"}) == "b"  # ranked last, not probed
    assert b.pick(6.0, random.Random(1).random) == "a"


def test_only_ejected_candidates_are_still_used():
    b = Balancer(["a", "b", "c"], outliers=OutlierSpec(max_ejection_percent=100.0))
    for _ in range(3):
        b.observe("a", C.CONNECT_FAILURE, 0.0)
    assert b.pick(1.0, random.Random(1).random, candidates=["a"]) == "a"


def test_without_outlier_detection_nothing_is_ejected():
    b = Balancer(["a", "b"])
    for _ in range(10):
        b.observe("a", C.CONNECT_FAILURE, 0.0)
    assert {b.pick(1.0, random.Random(s).random) for s in range(50)} == {"a", "b"}


# -- the engine: what a picker hears, and the free retry of a connect failure ----------------------------


def test_the_engine_reports_each_ended_attempt_and_a_per_try_timeout():
    b = Balancer(["a", "b"], outliers=OutlierSpec(consecutive_timeouts=1, max_ejection_percent=50.0))
    policy = RetryPolicy(per_try_timeout=1.0, max_attempts=2, retry_on=frozenset({C.TIMEOUT}))
    d = run(make_call(policy, balancer=b, rand=random.Random(3).random), [None, OK])
    timed_out = d.sends[0].endpoint
    assert d.finish.reason is R.SUCCESS
    assert b.outliers is not None and b.outliers.is_ejected(timed_out)


def test_a_cancelled_attempt_is_not_reported():
    b = Balancer(["a", "b"], outliers=OutlierSpec(consecutive_timeouts=1))
    policy = RetryPolicy(max_attempts=1)
    d = Driver(make_call(policy, balancer=b, deadline=1.0))
    d(START)
    d.tick()  # the deadline: the attempt is cancelled
    assert d.finish.reason is R.DEADLINE
    assert b.outliers is not None and not b.outliers.ejected


def grpc_budget(tokens: float) -> ThrottleSpec:
    return ThrottleSpec(ThrottleKind.GRPC, max_tokens=tokens, token_ratio=0.1)


def test_a_connect_failure_goes_elsewhere_at_once_without_spending_the_budget():
    b = Balancer(["a", "b"], outliers=SPEC)
    policy = RetryPolicy(max_attempts=3, throttle=grpc_budget(10))
    call = make_call(policy, balancer=b, rand=random.Random(5).random)
    d = Driver(call)
    (first,) = [c for c in d(START) if isinstance(c, SendAttempt)]
    out = d(AttemptEnded(1, CONNECT))
    assert d.decisions[-1].reason is R.TRANSPARENT_RETRY and d.decisions[-1].delay == 0.0
    (second,) = [c for c in out if isinstance(c, SendAttempt)]
    assert second.endpoint != first.endpoint
    d(AttemptEnded(2, OK))
    assert d.finish.reason is R.SUCCESS
    assert call.throttle is not None and call.throttle.tokens == 10  # nothing taken, nothing counted


def test_with_a_single_endpoint_a_connect_failure_backs_off_and_pays():
    b = Balancer(["a"], outliers=SPEC)
    policy = RetryPolicy(max_attempts=3, throttle=grpc_budget(10))
    d = run(make_call(policy, balancer=b), [CONNECT, OK])
    assert d.decisions[0].reason is R.RETRY and d.decisions[0].delay > 0


def test_no_free_retry_when_the_only_other_endpoint_is_ejected():
    b = Balancer(["a", "b"], outliers=SPEC)
    for _ in range(3):
        b.observe("b", C.CONNECT_FAILURE, 0.0)
    assert not b.alternative("a", None) and b.alternative("b", None)
    d = run(make_call(RetryPolicy(max_attempts=3), balancer=b), [CONNECT, OK], now=1.0)
    assert d.sends[0].endpoint == "a"
    assert d.decisions[0].reason is R.RETRY and d.decisions[0].delay > 0


def test_only_one_free_retry_per_request():
    b = Balancer(["a", "b", "c"], outliers=OutlierSpec(max_ejection_percent=100.0))
    policy = RetryPolicy(max_attempts=3, throttle=None)
    d = run(make_call(policy, balancer=b), [CONNECT, CONNECT, OK])
    assert [x.reason for x in d.decisions] == [R.TRANSPARENT_RETRY, R.RETRY, R.SUCCESS]


# -- configuration ----------------------------------------------------------------------------------------


def test_outlier_detection_is_on_by_default_and_spelled_out() -> None:
    from sidecar.config import effective, load_text

    cfg = load_text('upstreams: {api: {endpoints: ["127.0.0.1:1", "127.0.0.1:2"]}}', {})
    shown = effective(cfg)["upstreams"]["api"]["outlier_detection"]
    assert shown == {
        "enabled": True,
        "consecutive_connect_failures": 3,
        "consecutive_errors": 5,
        "consecutive_timeouts": 5,
        "base_ejection_time": "5s",
        "max_ejection_time": "1m",
        "max_ejection_percent": 50.0,
    }


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        ("{consecutive_errors: 0}", ("upstreams.api.outlier_detection.consecutive_errors", "greater than")),
        (
            "{base_ejection_time: 2m}",
            ("upstreams.api.outlier_detection", "must not exceed max_ejection_time"),
        ),
        ("{base_ejection_time: 0s}", ("upstreams.api.outlier_detection", "must be positive")),
        (
            "{max_ejection_percent: 120}",
            ("upstreams.api.outlier_detection.max_ejection_percent", "less than"),
        ),
        ("{interval: 10s}", ("upstreams.api.outlier_detection.interval", "unknown key")),
    ],
)
def test_outlier_detection_errors_name_their_path(keys: str, error: tuple[str, str]) -> None:
    from sidecar.config import ConfigError, load_text

    with pytest.raises(ConfigError) as e:
        load_text(f'upstreams: {{api: {{endpoints: ["127.0.0.1:1"], outlier_detection: {keys}}}}}', {})
    path, fragment = error
    assert any(p == path and fragment in m for p, m in e.value.errors), e.value.errors


def test_disabled_outlier_detection_gives_a_balancer_without_it() -> None:
    from sidecar.config import load_text
    from sidecar.services import outlier_spec

    cfg = load_text('upstreams: {api: {endpoints: ["127.0.0.1:1"], outlier_detection: {enabled: false}}}', {})
    assert outlier_spec(cfg.upstreams["api"]) is None
