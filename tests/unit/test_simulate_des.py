"""The des engine on small scenarios, in virtual time: invariants that hold whatever the numbers, and the
behaviours the lab exists to show. Each run takes well under a second."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.admission import RateLimiter
from sidecar.config.presets import deep_merge
from sidecar.simulate import des
from sidecar.simulate.record import Record
from sidecar.simulate.scenario import ScenarioError, from_dict, load
from sidecar.simulate.summary import amplification, summarize

SMALL: dict[str, Any] = {
    "name": "small",
    "duration": "40s",
    "warmup": "5s",
    "clients": {"count": 200, "rate": 50, "timeout": "1s"},
    "server": {"error_rate": 0.05},
    "outage": {"start": "10s", "duration": "10s", "mode": "error"},
    "sidecar": {"policy": {"extends": "http-default", "throttle": {"kind": "grpc", "max_tokens": 100}}},
}


def small(**changes: Any):  # noqa: ANN201
    return from_dict(deep_merge(SMALL, changes))


def totals(rec: Record) -> dict[str, int]:
    return {k: sum(getattr(s, k) for s in rec.seconds) for k in ("offered", "ok", "failed", "attempts")}


@pytest.mark.parametrize("strategy", ["fixed", "backoff", "sidecar"])
@pytest.mark.parametrize("mode", ["error", "stop", "brownout"])
def test_every_request_is_accounted_for(strategy: str, mode: str) -> None:
    s = small(outage={"mode": mode})
    rec = des.run(s, strategy)
    t = totals(rec)
    assert t["offered"] > 1000
    assert t["offered"] == t["ok"] + t["failed"] + rec.unfinished
    assert t["attempts"] >= t["offered"] - rec.unfinished


@pytest.mark.parametrize("mode", ["error", "stop", "brownout"])
def test_the_sidecar_never_exceeds_max_attempts(mode: str) -> None:
    s = small(outage={"mode": mode}, sidecar={"policy": {"max_attempts": 4, "throttle": None}})
    _, clients = des.simulate(s, "sidecar")
    assert 2 <= clients.max_attempts_seen <= 4
    if mode == "error":  # every attempt fails quickly: some requests use all four
        assert clients.max_attempts_seen == 4


def test_hedging_never_exceeds_its_max_attempts() -> None:
    s = small(
        server={"slow_fraction": 0.2, "error_rate": 0.2},
        sidecar={"policy": {"hedging": {"max_attempts": 3, "delay": "20ms"}, "throttle": None}},
    )
    _, clients = des.simulate(s, "sidecar")
    assert clients.max_attempts_seen == 3


@pytest.mark.parametrize("strategy", ["fixed", "backoff"])
def test_clients_stop_at_their_own_max_attempts(strategy: str) -> None:
    _, clients = des.simulate(small(clients={"max_attempts": 5}), strategy)
    assert clients.max_attempts_seen == 5


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    a = des.run(small(), "sidecar").to_json()
    assert a == des.run(small(), "sidecar").to_json()
    assert a != des.run(small(seed=2), "sidecar").to_json()


def test_the_retry_budget_bites_during_a_full_outage() -> None:
    """All attempts fail for 10 s: after the first moments, the bucket lets no retry through. Without it,
    every request makes its three attempts."""
    s = small(server={"error_rate": 0.0})
    o = s.outage
    assert o is not None
    throttled = des.run(s, "sidecar")
    assert amplification(throttled, o.start + 5, o.end) == pytest.approx(1.0)
    unthrottled = des.run(
        small(server={"error_rate": 0.0}, sidecar={"policy": {"throttle": None}}), "sidecar"
    )
    assert amplification(unthrottled, o.start + 5, o.end) == pytest.approx(3.0, abs=0.05)


def test_flaky_answers_are_hidden_for_about_five_percent_more_attempts() -> None:
    s = small(outage=None, duration="60s")
    sm = summarize("sidecar", des.run(s, "sidecar"), s)
    assert sm.success_rate is not None and sm.success_rate >= 0.999
    assert sm.amplification is not None and 1.03 < sm.amplification < 1.08


def test_a_stopped_server_answers_nothing_until_it_resumes() -> None:
    s = small(outage={"mode": "stop"}, server={"error_rate": 0.0})
    rec = des.run(s, "sidecar")
    assert all(sec.ok == 0 for sec in rec.seconds[11:20])
    assert rec.seconds[9].ok > 0 and sum(sec.ok for sec in rec.seconds[21:25]) > 0
    # in flight is frozen while it is stopped (nothing comes in, nothing goes out)
    assert len({sec.inflight for sec in rec.seconds[11:20]}) == 1


def test_the_seed_crash_fixed_interval_never_recovers_and_the_sidecar_does() -> None:
    """The article's result, in virtual time: the flood at resume plus fixed-interval retries keep the
    server past the point where answers take longer than the clients wait."""
    s = load("seed-crash", {"duration": "70s"})
    fixed = summarize("fixed", des.run(s, "fixed"), s)
    sidecar = summarize("sidecar", des.run(s, "sidecar"), s)
    assert not fixed.recovered
    assert sidecar.recovered and sidecar.recovery_s is not None and sidecar.recovery_s <= 5
    assert sidecar.peak_inflight < fixed.peak_inflight / 10
    assert sidecar.amplification_after == pytest.approx(1.0)


def test_many_sidecars_each_have_their_own_budget() -> None:
    """Spread over 50 sidecars, each bucket sees 1 request/s: it takes them longer to stop retrying."""
    s = small(server={"error_rate": 0.0})
    o = s.outage
    assert o is not None
    one = des.run(s, "sidecar")
    many = des.run(small(server={"error_rate": 0.0}, sidecar={"instances": 50}), "sidecar")
    first = (o.start, o.start + 3)
    assert amplification(many, *first) > amplification(one, *first) + 0.5  # type: ignore[operator]


def test_replicas_share_the_load_and_the_sidecar_balances_across_them() -> None:
    """Three replicas: the sidecar's balancer (power of two choices) spreads attempts; the same invariants
    hold, and with three times the capacity the peak in-flight stays below one replica's limit x 3."""
    s = small(outage=None, server={"replicas": 3, "error_rate": 0.05})
    rec, clients = des.simulate(s, "sidecar")
    t = totals(rec)
    assert t["offered"] == t["ok"] + t["failed"] + rec.unfinished
    assert clients.max_attempts_seen <= 3
    sent = clients.sidecars[0].servers.submitted
    assert sum(sent) == t["attempts"] and all(n > 0.25 * t["attempts"] for n in sent)
    assert max(sec.inflight for sec in rec.seconds) < 3 * s.server.concurrency_limit


# -- a request limiter at the sidecar's door (sidecar.admission.RateLimiter) -------------------------------


def limited(rate: float, burst: float, max_queue: int = 0, max_wait: float = 0.0) -> des.LimiterFactory:
    return lambda now: RateLimiter(rate, burst, now, max_queue=max_queue, max_wait=max_wait)


def test_a_request_limiter_holds_100000_clients_to_its_rate() -> None:
    """100,000 clients offer 900 requests/s through one sidecar limited to 250/s (capacity 50): from the
    start, the upstream's attempts by any second stay within rate x time + capacity; the rest are refused
    at once, without an attempt, and every request is still accounted for."""
    s = small(
        duration="20s",
        outage=None,
        server={"error_rate": 0.0},
        clients={"count": 100_000, "rate": 900},
        sidecar={"policy": {"max_attempts": 1, "throttle": None}},
    )
    rec, clients = des.simulate(s, "sidecar", limited(250, 0.2))
    t = totals(rec)
    assert t["offered"] == t["ok"] + t["failed"] + rec.unfinished
    sent = 0
    for second, sec in enumerate(rec.seconds):
        sent += sec.attempts
        assert sent <= 250 * (second + 1) + 50
    assert sent >= 250 * 20 * 0.95  # and it does admit its rate
    rejected = clients.sidecars[0].rejected  # type: ignore[union-attr]
    assert rejected == t["offered"] - t["attempts"]  # one attempt per admitted request (max_attempts 1)
    assert rejected > 0.6 * t["offered"]


def test_queueing_in_the_limiter_absorbs_bursts_below_the_rate() -> None:
    """45 requests/s, Poisson, against 50/s with a capacity of one token: refusing whatever finds the bucket
    empty refuses many; letting them wait up to 200 ms for a borrowed token refuses few, and the upstream
    still never sees more than the rate allows."""
    s = small(
        outage=None, server={"error_rate": 0.0}, clients={"rate": 45}, sidecar={"policy": {"throttle": None}}
    )
    _, refusing = des.simulate(s, "sidecar", limited(50, 0.02))
    rec, queueing = des.simulate(s, "sidecar", limited(50, 0.02, max_queue=20, max_wait=0.2))
    refused = refusing.sidecars[0].rejected  # type: ignore[union-attr]
    refused_queued = queueing.sidecars[0].rejected  # type: ignore[union-attr]
    assert refused > 100
    assert refused_queued < refused / 5
    assert sum(sec.attempts for sec in rec.seconds) <= 50 * 40 * 1.06  # retries of flaky answers: none here


def test_a_request_limiter_belongs_to_the_sidecar_strategy() -> None:
    with pytest.raises(ValueError, match="sidecar"):
        des.run(small(), "backoff", limited(10, 1))


# -- execution control in each sidecar (upstream.concurrency: sidecar.admission.EndpointConcurrency) -----------


def test_concurrency_tickets_hold_100000_clients_to_the_limit_at_the_server() -> None:
    """100,000 clients offer 3x what the server carries below its knee, through one sidecar whose endpoint has
    10 read tickets: the server never works on more than 10 requests at once (nothing is abandoned: every
    attempt is answered well within its deadline), the rest are refused before any attempt, and every request
    is still accounted for; without the tickets the server goes past its knee."""
    base = {
        "duration": "15s",
        "outage": None,
        "server": {"error_rate": 0.0, "jitter": "0ms"},
        "clients": {"count": 100_000, "rate": 900, "timeout": "2s"},
        "sidecar": {"policy": {"max_attempts": 2, "throttle": None}},
    }
    cc = {"mode": "fixed", "initial": 20, "max_queue": 0, "max_wait": "0s"}
    limited_cc = deep_merge(base, {"sidecar": {"upstream": {"concurrency": cc}}})
    rec, clients = des.simulate(small(**limited_cc), "sidecar")
    t = totals(rec)
    assert t["offered"] == t["ok"] + t["failed"] + rec.unfinished
    assert max(sec.inflight for sec in rec.seconds) == 10
    sidecar = clients.sidecars[0]  # type: ignore[union-attr]
    assert sidecar.ticket_refusals > t["offered"]  # each refused request was refused twice (max_attempts 2)
    assert t["ok"] > 80 * 15  # and the tickets are used: ~90 answers/s (10 at a time, 100 ms + a 10 ms tick)
    plain, _ = des.simulate(small(**base), "sidecar")
    assert max(sec.inflight for sec in plain.seconds) > 30


def test_probing_grows_from_too_few_tickets_and_queued_attempts_get_theirs() -> None:
    """50 requests/s at 100 ms need about 5 read tickets; probing starts with 2 (initial 4, half for reads):
    the pools are exhausted, so the prober probes up and keeps what raised the throughput; queued attempts
    are granted as tickets come back or the limit grows, and none waits past max_wait unserved for long."""
    cc = {
        "mode": "probing",
        "initial": 4,
        "min": 2,
        "max": 64,
        "interval": "100ms",
        "max_queue": 500,
        "max_wait": "1s",
    }
    s = small(outage=None, server={"error_rate": 0.0}, sidecar={"upstream": {"concurrency": cc}})
    rec, clients = des.simulate(s, "sidecar")
    t = totals(rec)
    assert t["offered"] == t["ok"] + t["failed"] + rec.unfinished
    sidecar = clients.sidecars[0]  # type: ignore[union-attr]
    endpoint = next(iter(sidecar.tickets.values()))
    stats = endpoint.pools.read.stats
    assert endpoint.prober.stable_concurrency > 4
    granted_from_queue = stats.removed_from_queue - stats.interrupted_in_queue - stats.rejected
    assert granted_from_queue > 0.5 * stats.added_to_queue > 0


# -- issue 26: probing that costs nothing at capacity; abandoned tickets bound what a stopped server holds --


def success(rec: Record) -> float:
    t = totals(rec)
    return t["ok"] / (t["ok"] + t["failed"])


def test_at_capacity_probing_answers_what_the_sidecar_without_tickets_answers() -> None:
    """The shipped at-capacity scenario: Poisson load at the upstream's capacity, tickets starting at its knee.
    The seed's prober keeps the limit near the knee and refuses the bursts above it (about 0.9 of what the
    sidecar without tickets answers); probing that grows through bursts answers the same share."""
    s = load("at-capacity", {"duration": "20s"})
    off = success(des.run(s, "sidecar"))
    rec, clients = des.simulate(s, "sidecar+tickets")
    assert success(rec) >= 0.97 * off
    endpoint = next(iter(clients.sidecars[0].tickets.values()))  # type: ignore[union-attr]
    assert endpoint.pools.read.limit > 4  # grown past the knee (4 workers) through the bursts


def test_a_stopped_server_holds_about_the_limit_when_abandoned_tickets_are_held() -> None:
    """The shipped crash-tickets scenario: with the tickets of abandoned attempts held until the server can be
    taken to have let them go, the stopped server holds less than 3x its limit when it resumes; with them
    given back at the abandonment (abandoned_hold 0), each deadline lets another request into its backlog."""
    s = load("crash-tickets")
    limit = s.server.concurrency_limit
    held = summarize("sidecar+tickets", des.run(s, "sidecar+tickets"), s)
    assert held.recovered and held.peak_inflight < 3 * limit
    plain = summarize("sidecar", des.run(s, "sidecar"), s)
    assert plain.recovered and plain.peak_inflight > 5 * limit
    unheld = deep_merge(s.model_dump(mode="json"), {"sidecar": {"tickets": {"abandoned_hold": "0s"}}})
    loose = from_dict(unheld)
    assert summarize("sidecar+tickets", des.run(loose, "sidecar+tickets"), loose).peak_inflight > 3 * limit


def test_the_tickets_strategy_names_its_own_keys_in_errors() -> None:
    with pytest.raises(ScenarioError, match=r"sidecar\.tickets\.initial"):
        des.run(small(sidecar={"tickets": {"initial": 1}}), "sidecar+tickets")
