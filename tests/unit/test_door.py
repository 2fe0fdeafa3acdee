"""A listener's door (sidecar/door.py) on an injected clock: the request and connection gates, exemptions,
shadow mode, and a reload that keeps the queue. No loop, no sleeps: ``now`` is passed in."""

from __future__ import annotations

import math

import pytest

from sidecar.admission import Limiter, RatePolicy, Refusal, Rejection
from sidecar.config.schema import AdmissionConfig
from sidecar.gates.door import Door, Wait


def profile(**kw: object) -> AdmissionConfig:
    return AdmissionConfig.model_validate(kw)


def door(now: float = 0.0, paths: tuple[str, ...] = (), **kw: object) -> Door:
    return Door("api", "front", profile(**kw), now, paths)


def test_the_burst_then_a_refusal_that_says_when_and_names_the_profile() -> None:
    d = door(requests={"rate": 10, "burst": "200ms"})  # two at once, then one per 100 ms
    assert d.request(0.0) is None and d.request(0.0) is None
    r = d.request(0.03)
    assert isinstance(r, Refusal)
    assert (r.limiter, r.reason, r.owner) == (Limiter.REQUESTS, Rejection.RATE_EXCEEDED, "listener 'api'")
    assert r.retry_after == pytest.approx(0.07)
    assert r.policy == RatePolicy("front", 10, 1)
    assert d.request(0.1) is None  # refilled


def test_a_queued_request_waits_for_its_borrowed_token_and_is_timed() -> None:
    d = door(requests={"rate": 10, "burst": "100ms", "max_queue": 2, "max_wait": "1s"})
    assert d.request(0.0) is None
    w1, w2 = d.request(0.0), d.request(0.0)
    assert isinstance(w1, Wait) and isinstance(w2, Wait)
    assert (w1.at, w2.at) == (pytest.approx(0.1), pytest.approx(0.2))
    third = d.request(0.0)
    assert isinstance(third, Refusal) and third.reason is Rejection.QUEUE_FULL
    d.admitted(w1, 0.1)
    d.interrupted(w2)  # its client went away: the token it borrowed goes back
    w3 = d.request(0.1)
    assert isinstance(w3, Wait) and w3.at == pytest.approx(0.2)  # its slot, not the one after it (0.3)
    assert d.requests is not None and d.requests.stats.interrupted_in_queue == 1
    hist = d.queue_seconds[Limiter.REQUESTS]
    assert sum(hist.counts) == 1 and hist.sum == pytest.approx(0.1)


def test_a_wait_past_the_deadline_or_max_wait_is_refused_at_once() -> None:
    d = door(requests={"rate": 1, "burst": "1s", "max_queue": 5, "max_wait": "500ms"})
    assert d.request(0.0) is None
    late = d.request(0.0, deadline=0.9)
    assert isinstance(late, Refusal) and late.reason is Rejection.MAX_WAIT  # 1 s away, max_wait first
    d2 = door(requests={"rate": 1, "burst": "1s", "max_queue": 5, "max_wait": "none"})
    assert d2.request(0.0) is None
    r = d2.request(0.0, deadline=0.9)
    assert isinstance(r, Refusal) and r.reason is Rejection.DEADLINE and r.retry_after == pytest.approx(1.0)
    assert isinstance(d2.request(0.0, deadline=math.inf), Wait)


def test_shadow_mode_admits_everything_and_counts_what_it_would_have_done() -> None:
    d = door(requests={"rate": 1, "burst": "1s", "max_queue": 1, "max_wait": "5s"}, shadow=True)
    assert [d.request(0.0) for _ in range(4)] == [None] * 4
    assert d.requests is not None
    stats = d.requests.stats
    # one at once, one would have waited (its place kept), two refused: the queue was full
    assert (stats.attempted, stats.successful, stats.added_to_queue, stats.rejected) == (4, 1, 1, 2)
    assert stats.rejected_by[Rejection.QUEUE_FULL] == 2 and d.requests.queued == 1
    assert d.request(1.0) is None  # the would-be wait ends when due; this one would wait in turn
    assert (stats.successful, stats.added_to_queue, d.requests.queued) == (2, 2, 1)
    assert d.queue_seconds[Limiter.REQUESTS].sum == pytest.approx(1.0)  # the wait it would have had


def test_exempt_addresses_paths_and_bypassed_connections() -> None:
    d = door(
        paths=("/healthz", "/internal/*"),
        requests={"rate": 1, "exempt_cidrs": ["10.0.0.0/8", "::1/128"]},
        connections={"rate": 1, "bypass_cidrs": ["192.168.0.0/16"]},
    )
    assert d.client_exempt("10.1.2.3") and d.client_exempt("::ffff:10.9.9.9") and d.client_exempt("::1")
    assert not d.client_exempt("11.0.0.1") and not d.client_exempt("") and not d.client_exempt("not-an-ip")
    assert d.path_exempt("/healthz") and d.path_exempt("/internal/") and d.path_exempt("/internal/x/y")
    assert not d.path_exempt("/healthz/x") and not d.path_exempt("/internals")
    assert d.connection("192.168.3.4", 0.0) is None and d.connection("192.168.3.4", 0.0) is None
    assert d.connections is not None and d.connections.stats.exempted == 2
    assert d.connection("8.8.8.8", 0.0) is None
    held = d.connection("8.8.8.8", 0.0)  # max_queue 64 by default: it waits
    assert isinstance(held, Wait) and held.limiter is Limiter.CONNECTIONS


def test_a_reload_keeps_the_balance_and_the_queue_under_new_limits() -> None:
    d = door(requests={"rate": 10, "burst": "100ms", "max_queue": 5, "max_wait": "1s"})
    bucket = d.requests
    assert d.request(0.0) is None
    w = d.request(0.0)
    assert isinstance(w, Wait)
    d.reconfigure("back", profile(requests={"rate": 100, "burst": "1s", "max_queue": 0}), 0.0)
    assert d.requests is bucket and bucket is not None and bucket.queued == 1 and bucket.rate == 100
    refused = d.request(0.0)  # the balance carried over (one borrowed): no queue any more
    assert isinstance(refused, Refusal) and refused.policy == RatePolicy("back", 100, 1)
    d.admitted(w, w.at)
    assert bucket.queued == 0
    d.reconfigure("none", profile(), 1.0)
    assert d.requests is None and d.request(1.0) is None
