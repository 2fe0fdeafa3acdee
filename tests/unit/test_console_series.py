"""The console's sampler (a point a second from the counters) and its quantiles, with times passed in."""

from __future__ import annotations

import math

import pytest

from sidecar.admin.console_series import CHARTED_ENDPOINTS, POINTS, Sampler, quantile
from sidecar.telemetry.metrics import ListenerMeters, Meters

BOUNDS = (0.01, 0.1, 1.0)


@pytest.mark.parametrize(
    ("counts", "q", "expected"),
    [
        ([10, 0, 0, 0], 0.5, 0.005),  # interpolated from 0 in the first bucket
        ([0, 10, 0, 0], 0.5, 0.055),  # halfway through (0.01, 0.1]
        ([0, 10, 0, 0], 0.99, 0.01 + 0.09 * 0.99),
        ([50, 50, 0, 0], 0.99, 0.01 + 0.09 * 0.98),
        ([0, 0, 0, 5], 0.5, 1.0),  # the +Inf bucket: the highest finite bound, as histogram_quantile
        ([1, 0, 0, 1], 0.5, 0.01),
    ],
)
def test_quantiles_are_interpolated_as_prometheus_does(counts: list[int], q: float, expected: float) -> None:
    assert quantile(BOUNDS, counts, q) == pytest.approx(expected)


def test_an_empty_histogram_has_no_quantile() -> None:
    assert math.isnan(quantile(BOUNDS, [0, 0, 0, 0], 0.99))


def requests(m: Meters, n: int, reason: str = "success", attempts: int = 1, took: float = 0.003) -> None:
    for _ in range(n):
        m.request(reason)
        for _ in range(attempts):
            m.attempt("success")
        m.duration.observe(took)


def test_each_point_is_what_changed_in_the_second_before_it() -> None:
    s = Sampler()
    m = Meters(ListenerMeters())
    pair = ("web", "orders")
    s.sample(1000.0, 10.0, [(pair, m)], [], [], {})
    assert s.last[pair]["rps"] != s.last[pair]["rps"]  # NaN: nothing to compare the first sample with
    requests(m, 90)
    requests(m, 10, reason="attempts-exhausted", attempts=3, took=0.2)
    m.retry("overloaded")
    m.retry("overloaded")
    m.retry("unavailable")
    m.hedges += 4
    s.sample(1002.0, 12.0, [(pair, m)], [("orders", "a:1", 32, 7)], [("web", 6)], {"orders": {"a:1": [1, 0]}})
    last = s.last[pair]
    assert last["rps"] == 50.0  # 100 requests over the 2 s since the last point
    assert last["success"] == 0.9
    assert last["amplification"] == pytest.approx(1.2)  # 120 attempts for 100 requests
    assert last["retries"] == 1.5 and last["retries_by_cause"] == {"overloaded": 1.0, "unavailable": 0.5}
    assert last["hedges"] == 2.0
    assert last["p50"] == pytest.approx(2.5 + 2.5 * 50 / 90)  # ms: rank 50 of the 90 in (2.5 ms, 5 ms]
    assert 100 < last["p99"] <= 250  # the slow tenth
    assert math.isnan(s.refused_last["web"])  # the first reading of the door
    doc = s.series(-1)
    assert doc["first"] == 0 and doc["next"] == 2 and doc["t"] == [1000.0, 1002.0]
    (p,) = doc["pairs"]
    assert p["rps"] == [None, 50.0] and p["success"] == [None, 0.9]
    (e,) = doc["endpoints"]
    assert (e["upstream"], e["endpoint"], e["limit"], e["in_use"]) == (
        "orders",
        "a:1",
        [None, 32.0],
        [None, 7.0],
    )
    assert s.series(0)["t"] == [1002.0]  # only what came after sample 0
    assert s.series(1)["t"] == []

    s.sample(1003.0, 13.0, [(pair, m)], [], [("web", 9)], {"orders": {"a:1": [2, 5]}})
    assert s.last[pair]["rps"] == 0.0 and math.isnan(s.last[pair]["success"])
    assert s.refused_last["web"] == 3.0
    assert s.recent_outcomes("orders") == {"a:1": [3, 5]}


def test_a_pair_born_between_two_samples_counts_everything_it_did() -> None:
    s = Sampler()
    old = Meters(ListenerMeters())
    s.sample(0.0, 0.0, [(("web", "a"), old)], [], [], {})
    new = Meters(ListenerMeters())
    requests(new, 5)
    s.sample(1.0, 1.0, [(("web", "a"), old), (("web", "b"), new)], [], [], {})
    assert s.last[("web", "b")]["rps"] == 5.0


def test_the_rings_hold_five_minutes_and_forget_what_is_gone() -> None:
    s = Sampler()
    m = Meters(ListenerMeters())
    gone = Meters(ListenerMeters())
    for i in range(POINTS + 120):
        pairs = [(("web", "orders"), m)] + ([(("web", "old"), gone)] if i < 10 else [])
        s.sample(
            float(i),
            float(i),
            pairs,
            [("orders", f"e{k}", k, 0) for k in range(CHARTED_ENDPOINTS + 5)],
            [],
            {},
        )
    doc = s.series(-1)
    assert len(doc["t"]) == POINTS and doc["t"][0] == 120.0 and doc["next"] == POINTS + 120
    assert [(p["listener"], p["upstream"]) for p in doc["pairs"]] == [("web", "orders")]
    assert len(doc["endpoints"]) == CHARTED_ENDPOINTS  # the first ones seen, at most this many per upstream
