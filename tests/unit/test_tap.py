"""The tap: what an observer records while it is armed (and not while it is not), the ring's bounds, and the
endpoint states the console reads. No sockets: the observer is told what the runtime would tell it."""

from __future__ import annotations

import math

from sidecar.admin.console_state import endpoint_states
from sidecar.admission.reasons import Limiter, Rejection
from sidecar.admission.refusal import Refusal
from sidecar.config import UpstreamConfig
from sidecar.policy import (
    CancelAttempt,
    Decision,
    Finish,
    Outcome,
    OutcomeClass,
    Pushback,
    Reason,
    SendAttempt,
)
from sidecar.services import UpstreamRuntime
from sidecar.telemetry import Telemetry
from sidecar.telemetry.tap import OUTCOMES, Tap

C = OutcomeClass


def observe(t: Telemetry, path: str = "/orders/1") -> None:
    """One request as the runtime reports it: attempt 1 overloaded (a 20 ms pushback), a retry after 10 ms,
    attempt 2 succeeds, 200 answered."""
    obs = t.request(
        listener="web", upstream="orders", protocol="http", name="GET", attributes={"url.path": path}
    )
    obs.deadline_received(0.5)
    obs.attempt_started(SendAttempt(1, "a:1", 0.5, True))
    obs.attempt_ended(1, Outcome(C.OVERLOADED, pushback=Pushback(0.02), detail="503"))
    obs.decision(Decision(1, "a:1", C.OVERLOADED, Reason.RETRY, 0.01))
    obs.attempt_started(SendAttempt(2, "b:2", 0.47, True))
    obs.attempt_ended(2, Outcome(C.SUCCESS, detail="200"))
    obs.decision(Decision(2, "b:2", C.SUCCESS, Reason.SUCCESS))
    obs.finished(Finish(Reason.SUCCESS, 2, Outcome(C.SUCCESS), 2))
    obs.set_attribute("http.response.status_code", 200)
    obs.end()


def test_an_armed_tap_records_each_attempt_its_outcome_the_decision_and_the_wait() -> None:
    t = Telemetry()
    t.tap = tap = Tap()
    observe(t)
    (rec,) = tap.ring
    d = rec.as_dict(str)
    assert d["seq"] == 1 and tap.seq == 1
    assert (d["listener"], d["upstream"], d["protocol"], d["route"]) == (
        "web",
        "orders",
        "http",
        "GET /orders/1",
    )
    assert (d["reason"], d["status"], d["deadline_ms"]) == ("success", "200", 500.0)
    first, second = d["attempts"]
    assert first["endpoint"] == "a:1" and first["outcome"] == "overloaded" and first["detail"] == "503"
    assert first["pushback_ms"] == 20.0 and first["decision"] == "retry" and first["wait_ms"] == 10.0
    assert second["n"] == 2 and second["endpoint"] == "b:2" and second["decision"] == "success"
    assert "wait_ms" not in second and "pushback_ms" not in second
    assert d["total_ms"] >= second["start_ms"] + second["ms"] >= first["start_ms"]
    assert tap.outcomes_taken() == {
        "orders": {
            "a:1": [1 if c == "overloaded" else 0 for c in OUTCOMES],
            "b:2": [1 if c == "success" else 0 for c in OUTCOMES],
        }
    }
    assert tap.outcomes_taken() == {}  # taken: the next second starts from nothing


def test_an_unarmed_tap_records_nothing() -> None:
    t = Telemetry()
    obs = t.request(listener="web", upstream="orders", protocol="http", name="GET")
    assert obs.tap is None
    tap = Tap()
    observe(t)  # while nobody looks
    assert tap.seq == 0 and not tap.ring


def test_cancelled_hedges_refusals_and_errors_are_recorded_and_free_text_goes_through_the_redactor() -> None:
    t = Telemetry()
    t.tap = tap = Tap()
    obs = t.request(listener="web", upstream="orders", protocol="grpc", name="pkg.Svc/Get")
    obs.attempt_started(SendAttempt(1, "a:1", math.inf, True))
    obs.attempt_started(SendAttempt(2, "b:2", math.inf, True, hedge=1))
    obs.attempt_ended(2, Outcome(C.SUCCESS, detail="OK"))
    obs.attempt_cancelled(CancelAttempt(1, Reason.HEDGE_LOST))
    obs.finished(Finish(Reason.SUCCESS, 2, Outcome(C.SUCCESS), 2))
    obs.end()
    refused = t.request(listener="web", upstream="orders", protocol="http", name="POST")
    refused.refused(Refusal(Limiter.REQUESTS, Rejection.RATE_EXCEEDED, 0.2, "listener 'web'"))
    refused.end("rate limited: secret-in-text")
    hedged, denied = (r.as_dict(lambda s: s.replace("secret", "<redacted>")) for r in tap.ring)
    a1, a2 = hedged["attempts"]
    assert a1["cancelled"] == "hedge-lost" and "outcome" not in a1 and a2["hedge"] == 1
    assert hedged["route"] == "pkg.Svc/Get"
    assert denied["reason"] == "admission-requests" and denied["attempts"] == []
    assert denied["error"] == "rate limited: <redacted>-in-text"
    counts = tap.outcomes_taken()["orders"]
    assert counts["a:1"][OUTCOMES.index("cancelled")] == 1 and counts["b:2"][OUTCOMES.index("success")] == 1


def test_the_ring_keeps_the_last_requests_and_says_how_many_a_late_reader_missed() -> None:
    t = Telemetry()
    t.tap = tap = Tap(capacity=3)
    for i in range(5):
        observe(t, f"/{i}")
    assert [r.seq for r in tap.ring] == [3, 4, 5]
    records, missed = tap.after(-1)
    assert [r.path for r in records] == ["/2", "/3", "/4"] and missed == 0
    records, missed = tap.after(1)  # 2 was pushed out before this reader came back
    assert [r.seq for r in records] == [3, 4, 5] and missed == 1
    records, missed = tap.after(4)
    assert [r.seq for r in records] == [5] and missed == 0
    assert list(tap.after(5)[0]) == []


def test_endpoint_states_are_read_in_one_place() -> None:
    up = UpstreamRuntime(
        "orders",
        UpstreamConfig(
            endpoints=["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"], overload_cooldown="5s"
        ),
        Telemetry(),
    )
    b = up.balancer
    b.penalize("10.0.0.2:80", 100.0)
    assert b.outliers is not None
    for _ in range(5):
        b.observe("10.0.0.3:80", C.UNAVAILABLE, 100.0)
    b.started("10.0.0.1:80")
    states = {s.endpoint: s for s in endpoint_states(up, 101.0)}
    assert (states["10.0.0.1:80"].state, states["10.0.0.1:80"].outstanding, states["10.0.0.1:80"].left) == (
        "active",
        1,
        None,
    )
    assert states["10.0.0.2:80"].state == "cooldown" and states["10.0.0.2:80"].left == 4.0
    assert states["10.0.0.3:80"].state == "ejected" and states["10.0.0.3:80"].left == 4.0
    assert endpoint_states(up, 106.0)[1].state == "active"  # b's cooldown is over
    # an endpoint that left the set (a name resolved elsewhere, a reload) with an attempt still out drains
    b.started("10.0.0.4:80")
    b.update(["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"])
    states = {s.endpoint: s for s in endpoint_states(up, 101.0)}
    assert (states["10.0.0.4:80"].state, states["10.0.0.4:80"].outstanding) == ("draining", 1)
    b.finished("10.0.0.4:80")
    assert "10.0.0.4:80" not in {s.endpoint for s in endpoint_states(up, 101.0)}  # drained: gone
