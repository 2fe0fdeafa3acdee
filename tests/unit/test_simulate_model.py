"""The model server's core: the seed's latency law, answers falling due, faults. Virtual time only."""

from __future__ import annotations

import random

import pytest

from sidecar.simulate.model import OK, UNAVAILABLE, ModelServer, delay
from sidecar.simulate.retry import Waits
from sidecar.simulate.scenario import ClientsSpec, OutageSpec, ServerSpec

LAW = ServerSpec.model_validate(
    {"min_delay": "100ms", "concurrency_limit": 30, "factor": 1.05, "k": 15, "jitter": 0}
)


def test_the_law_is_flat_up_to_the_limit_then_exponential() -> None:
    assert delay(LAW, 0) == delay(LAW, 30) == pytest.approx(0.1)
    assert delay(LAW, 45) == pytest.approx(0.1 * 1.05)
    assert delay(LAW, 30 + 15 * 20) == pytest.approx(0.1 * 1.05**20)
    assert delay(LAW, 10**9) == float("inf")


def test_capacity_halves_the_limit_and_doubles_the_minimal_delay() -> None:
    assert delay(LAW, 15, capacity=0.5) == pytest.approx(0.2)
    assert delay(LAW, 30, capacity=0.5) == pytest.approx(0.2 * 1.05)


def test_answers_fall_due_after_the_delay_for_the_crowd_now() -> None:
    server = ModelServer(LAW, None, random.Random(1))
    for i in range(31):
        assert server.admit(0.0, i) is None
    assert server.inflight == 31
    # 31 in flight: the delay is above min_delay, so nothing is due at 0.1
    assert server.due(0.1) == []
    assert server.due(0.1 + 0.1 * 1.05 ** (1 / 15)) == [(i, OK) for i in range(31)]
    assert server.inflight == 0


def test_a_request_whose_client_left_keeps_its_place() -> None:
    """Nothing is cancelled: the server learns of no client leaving, as in the seed."""
    server = ModelServer(LAW, None, random.Random(1))
    server.admit(0.0, "abandoned")
    server.admit(0.05, "later")
    assert server.due(0.1) == [("abandoned", OK)]
    assert server.due(0.16) == [("later", OK)]


def test_slow_requests_need_slow_factor_times_the_delay() -> None:
    spec = LAW.model_copy(update={"slow_fraction": 1.0, "slow_factor": 50.0})
    server = ModelServer(spec, None, random.Random(1))
    server.admit(0.0, "slow")
    assert server.due(4.99) == []
    assert server.due(5.0) == [("slow", OK)]


def test_error_rate_answers_503_after_the_delay() -> None:
    spec = LAW.model_copy(update={"error_rate": 1.0})
    server = ModelServer(spec, None, random.Random(1))
    assert server.admit(0.0, "x") is None
    assert server.due(0.1) == [("x", UNAVAILABLE)]


def test_an_error_outage_answers_503_at_once_and_holds_nothing() -> None:
    server = ModelServer(
        LAW, OutageSpec.model_validate({"start": "10s", "duration": "5s", "mode": "error"}), random.Random(1)
    )
    assert server.admit(9.9, "before") is None
    assert server.admit(10.0, "during") == UNAVAILABLE
    assert server.inflight == 1
    assert server.admit(15.0, "after") is None


def test_a_brownout_slows_answers_only_while_it_lasts() -> None:
    outage = OutageSpec.model_validate(
        {"start": "10s", "duration": "5s", "mode": "brownout", "capacity": 0.5}
    )
    server = ModelServer(LAW, outage, random.Random(1))
    server.admit(10.0, "a")
    assert server.due(10.15) == []
    assert server.due(10.2) == [("a", OK)]
    server.admit(20.0, "b")
    assert server.due(20.1) == [("b", OK)]


def test_jitter_is_the_requests_own_and_bounded() -> None:
    spec = LAW.model_copy(update={"jitter": 0.02})
    server = ModelServer(spec, None, random.Random(3))
    for i in range(20):
        server.admit(0.0, i)
    assert server.due(0.0999) == []
    assert sorted(job for job, _ in server.due(0.12)) == list(range(20))


def test_fixed_retries_wait_the_interval_every_time() -> None:
    w = Waits("fixed", ClientsSpec.model_validate({"fixed_interval": "100ms"}), random.Random(1))
    assert [w.next() for _ in range(4)] == [0.1] * 4


def test_backoff_follows_the_seeds_pseudo_code() -> None:
    spec = ClientsSpec.model_validate(
        {"backoff": {"min_delay": "100ms", "max_delay": "1s", "factor": 2.0, "jitter": 0}}
    )
    w = Waits("backoff", spec, random.Random(1))
    assert [round(w.next(), 6) for _ in range(6)] == [0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


def test_backoff_jitter_is_normal_and_proportional() -> None:
    spec = ClientsSpec.model_validate(
        {"backoff": {"min_delay": "100ms", "max_delay": "5m", "factor": 2.718, "jitter": 0.1}}
    )
    firsts = [Waits("backoff", spec, random.Random(seed)).next() for seed in range(2000)]
    mean = sum(firsts) / len(firsts)
    sd = (sum((x - mean) ** 2 for x in firsts) / len(firsts)) ** 0.5
    assert mean == pytest.approx(0.2718, rel=0.02)
    assert sd == pytest.approx(0.02718, rel=0.1)


def test_a_server_with_workers_has_a_knee_and_serves_in_turn() -> None:
    """4 workers x 40 ms: below the knee nothing waits; past it, each worker that frees up takes the next
    request at once, first come first served, and the queue counts as in flight."""
    spec = ServerSpec.model_validate({"workers": 4, "min_delay": "40ms", "jitter": 0})
    server = ModelServer(spec, None, random.Random(1))
    for i in range(10):
        server.admit(0.0, i)
    assert server.inflight == 10 and spec.limit == 4
    assert server.due(0.039) == []
    assert server.due(0.04) == [(i, OK) for i in range(4)]
    assert server.due(0.1) == [(i, OK) for i in range(4, 8)]  # started at 40 ms, done at 80 ms
    assert server.inflight == 2
    server.admit(0.2, 10)  # idle workers: no wait
    assert sorted(server.due(0.25)) == [(8, OK), (9, OK), (10, OK)]  # 8, 9 done at 120 ms; 10 at 240 ms
    assert server.inflight == 0
