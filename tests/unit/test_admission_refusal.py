"""A refusal, and how each protocol says it (issue 12 "Rejections in each protocol's own language"): built
from a real bucket's rejection on a virtual clock; the answers read back with the protocol's own decoders."""

from __future__ import annotations

import bson
import grpc
import pytest

from sidecar.adapters.grpc import answer as grpc_answer
from sidecar.adapters.http import answer as http_answer
from sidecar.adapters.mongo import answer as mongo_answer
from sidecar.admission import Decision, Limiter, RateLimiter, RatePolicy, Refusal, Rejection, Verdict


def rate_refusal() -> Refusal:
    bucket = RateLimiter(rate=20, burst=0.05, now=100.0)  # capacity 1: one request, then 50 ms per token
    assert bucket.try_acquire(100.0).admitted
    decision = bucket.try_acquire(100.01)
    assert decision.rejected
    return Refusal.of(
        Limiter.REQUESTS, decision, 100.01, owner="listener 'api'", policy=RatePolicy.of("front-door", 20, 0.05)
    )


def test_a_refusal_from_a_bucket_says_when_a_token_is_free() -> None:
    r = rate_refusal()
    assert r.limiter is Limiter.REQUESTS and r.reason is Rejection.RATE_EXCEEDED
    assert r.retry_after == pytest.approx(0.04)
    assert r.retry_after_ms == 40
    assert r.retry_after_seconds == 1  # rounded up
    assert r.message == (
        "request rate limit of listener 'api' exceeded (rate-exceeded: no token is free); retry after 40 ms"
    )
    assert r.attributes() == {
        "sidecar.admission.limiter": "requests",
        "sidecar.admission.reason": "rate-exceeded",
        "sidecar.admission.retry_after_ms": 40,
        "sidecar.admission.policy": "front-door",
    }


def test_an_unknown_or_past_time_is_no_wait() -> None:
    d = Decision(Verdict.REJECTED, 5.0, Rejection.QUEUE_FULL)
    r = Refusal.of(Limiter.CONCURRENCY, d, 5.0, owner="upstream 'db' endpoint 'db-0:27017'")
    assert r.retry_after == 0 and r.retry_after_seconds == 0 and r.retry_after_ms == 0
    assert r.message == "concurrency limit of upstream 'db' endpoint 'db-0:27017' exceeded (queue-full: the queue is full)"
    assert Refusal.of(Limiter.CONCURRENCY, Decision(Verdict.REJECTED, float("inf"), Rejection.MAX_WAIT), 1.0).retry_after == 0


def test_only_a_rejection_is_a_refusal() -> None:
    with pytest.raises(ValueError, match="only a rejected decision"):
        Refusal.of(Limiter.REQUESTS, Decision(Verdict.ADMITTED, 1.0), 1.0)
    with pytest.raises(ValueError, match="retry_after"):
        Refusal(Limiter.REQUESTS, Rejection.RATE_EXCEEDED, -1.0)


@pytest.mark.parametrize(
    ("rate", "burst", "quota", "window"),
    [
        (500, 1.0, 500, 1),  # the example: 500 a second
        (100, 2.5, 300, 3),  # the burst rounded up to whole seconds, the quota what refills in it
        (20, 0.1, 20, 1),  # a window is at least one second
        (0.5, 1.0, 1, 2),  # ... and long enough for one whole token
        (1 / 3, 1.0, 1, 3),
    ],
)
def test_a_bucket_as_a_ratelimit_policy(rate: float, burst: float, quota: int, window: int) -> None:
    assert RatePolicy.of("p", rate, burst) == RatePolicy("p", quota, window)


def headers(answer: http_answer.Answer) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in answer.headers}


def test_http_429_for_a_rate_with_retry_after_and_the_ietf_fields() -> None:
    a = http_answer.refused(rate_refusal())
    assert a.status == 429
    assert headers(a) == {
        "Retry-After": "1",
        "RateLimit-Policy": '"front-door";q=20;w=1',
        "RateLimit": '"front-door";r=0;t=1',
    }
    assert a.body == b"retry-sidecar: " + rate_refusal().message.encode() + b"\n"
    wire = http_answer.encode(a, keep_alive=True)
    assert wire.startswith(b"HTTP/1.1 429 Too Many Requests\r\n") and b"\r\nRetry-After: 1\r\n" in wire


def test_http_503_for_concurrency_without_ratelimit_fields() -> None:
    r = Refusal(Limiter.CONCURRENCY, Rejection.MAX_WAIT, 2.2, owner="upstream 'orders'")
    a = http_answer.refused(r)
    assert a.status == 503 and headers(a) == {"Retry-After": "3"}


def test_http_policy_names_are_structured_field_strings() -> None:
    r = Refusal(Limiter.REQUESTS, Rejection.QUEUE_FULL, 0.5, policy=RatePolicy('a"b\\c\u00e9', 5, 1))
    assert headers(http_answer.refused(r))["RateLimit-Policy"] == '"a\\"b\\\\c?";q=5;w=1'


def test_grpc_resource_exhausted_with_pushback() -> None:
    a = grpc_answer.refused(rate_refusal())
    assert a.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert a.details == "retry-sidecar: " + rate_refusal().message
    assert a.trailing == [("grpc-retry-pushback-ms", "40")]
    # refused on a retry (no ticket for attempt 3): A6's count of the attempts before it, as every answer
    again = grpc_answer.refused(rate_refusal(), previous=2)
    assert again.trailing == [("grpc-retry-pushback-ms", "40"), ("grpc-previous-rpc-attempts", "2")]


def test_mongo_462_with_the_overload_labels() -> None:
    doc = bson.decode(mongo_answer.refusal_doc(rate_refusal()))
    assert doc == {
        "ok": 0.0,
        "errmsg": "retry-sidecar: " + rate_refusal().message,
        "code": 462,
        "codeName": "IngressRequestRateLimitExceeded",
        "errorLabels": ["SystemOverloadedError", "RetryableError"],
    }
    tickets = Refusal(Limiter.CONCURRENCY, Rejection.QUEUE_FULL, 0.0, owner="upstream 'db'")
    doc = bson.decode(mongo_answer.refusal_doc(tickets))
    assert doc["code"] == 462 and doc["errorLabels"] == ["SystemOverloadedError", "RetryableError"]
    assert "concurrency limit of upstream 'db'" in doc["errmsg"]


def test_a_refused_requests_span_carries_the_limiter_and_the_reason() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from sidecar.telemetry import Telemetry

    exporter = InMemorySpanExporter()
    telemetry = Telemetry(span_exporter=exporter)
    refusal = rate_refusal()
    obs = telemetry.request(listener="api", upstream="orders", protocol="http", name="GET")
    obs.refused(refusal)
    obs.end(refusal.reason.value)
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert {k: span.attributes[k] for k in refusal.attributes()} == refusal.attributes()
    assert span.attributes["sidecar.decision.reason"] == "admission-requests"
    assert span.status.description == "rate-exceeded"
