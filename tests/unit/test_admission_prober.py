"""Throughput probing: under overload the seed's pseudocode step by step; at rest no door ever lowered and
no request ever refused that the stable limit would have admitted; bursts growing the limit; then scripted
throughput curves and real pools."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.admission import (
    EndpointConcurrency,
    Interval,
    Kind,
    ProbeSpec,
    ProbeState,
    ThroughputProber,
    split_concurrency,
)
from sidecar.admission.prober import QUIET

FAST = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
S, UP, DOWN = ProbeState.STABLE, ProbeState.UP, ProbeState.DOWN
SPEC = ProbeSpec(initial=32, min=4, max=256, read_write_ratio=0.5, step=0.1, ema_weight=0.2)


def overload(returned: int) -> Interval:
    """An interval of overload: exhausted, and more attempts refused than let in (demand 3x the door)."""
    return Interval(returned, exhausted=True, peak=32, admitted=returned, refused=2 * returned)


def burst(returned: int, peak: int = 32) -> Interval:
    """Exhausted in a moment: one attempt refused for ten let in."""
    return Interval(returned, exhausted=True, peak=peak, admitted=returned, refused=returned // 10)


def rest(returned: int, peak: int) -> Interval:
    return Interval(returned, exhausted=False, peak=peak, admitted=returned)


def test_under_overload_the_seed_pseudocode_step_by_step():
    """Each row: an interval of 100 ms ends with `returned` tickets back, the pools exhausted by demand three
    times what they let in; the expected state, stable concurrency and (read, write) limits, computed by hand
    from the seed."""
    p = ThroughputProber(SPEC, now=0.0)
    assert (p.state, p.limits) == (S, (16, 16))
    rows = [
        # returned -> state, stableConcurrency, limits      why
        (100, UP, 32.0, (18, 17)),  # stable: 1000/s recorded; exhausted, below max: 32 x 1.1 = 35.2 -> 35
        (120, S, 32.6, (17, 16)),  # up: 1200 > 1000: EMA 35 x .2 + 32 x .8 = 32.6 -> 33
        (110, UP, 32.6, (18, 18)),  # stable: 1100/s; 32.6 x 1.1 = 35.86 -> 36
        (100, S, 32.6, (17, 16)),  # up: 1000 < 1100: back to the stable 32.6 -> 33
    ]
    for i, (returned, state, stable, limits) in enumerate(rows, start=1):
        assert p.run(i / 10, overload(returned)) is state, i
        assert p.stable_concurrency == pytest.approx(stable), i
        assert p.limits == limits, i


def test_at_the_maximum_under_overload_the_seed_probes_down_and_throughput_decides():
    """The seed's diagram: "... or at maximum" probe down; kept (EMA) if throughput rose, else back."""
    p = ThroughputProber(ProbeSpec(initial=40, min=4, max=40), now=0.0)
    assert p.run(0.1, overload(100)) is DOWN  # stable: 1000/s; at max: 40 x .9 = 36
    assert p.get_current_concurrency() == 36
    assert p.run(0.2, overload(105)) is S  # down: 1050 > 1000: EMA 36 x .2 + 40 x .8 = 39.2 -> 39
    assert (p.stable_concurrency, p.get_current_concurrency()) == (pytest.approx(39.2), 39)
    assert p.run(0.3, overload(100)) is UP  # 39 is below max again: probe up (39.2 x 1.1 = 43.1 -> 40)
    assert p.get_current_concurrency() == 40
    assert p.run(0.4, overload(90)) is S  # 900 < 1000: back to 39
    assert p.get_current_concurrency() == 39


def test_at_rest_the_door_never_moves_down():
    """The seed probes down every other interval at rest (tickets not exhausted): in a proxy, each of those
    is a window of refusals. Here the limits stay, interval after interval, and the state stays stable."""
    p = ThroughputProber(SPEC, now=0.0)
    for i in range(1, 200):
        assert p.run(i / 10, rest(100, peak=30)) is S
        assert p.limits == (16, 16)
    assert p.stable_concurrency == 32


@FAST
@given(
    st.integers(2, 40),
    st.integers(0, 200),
    st.lists(st.tuples(st.floats(0.0, 1.0), st.booleans()), min_size=1, max_size=300),
)
def test_a_request_the_stable_limit_admits_is_never_refused(initial, extra, script):
    """Real pools (``max_queue: 0``: a ticket not free is a refusal) driven with any demand within the stable
    limit (a share of it each interval, ``full``: all of it at once): not one acquisition is refused. With
    the seed's probe down on the door at rest this fails at the first probe."""
    spec = ProbeSpec(initial=initial, min=2, max=initial + extra)
    c = EndpointConcurrency(spec, now=0.0, probing=True, max_queue=0, max_wait=0.0)
    assert c.prober is not None
    for i, (share, full) in enumerate(script, start=1):
        stable_read, _ = split_concurrency(c.prober._clamp(round(c.prober.stable_concurrency)), 0.5)
        demand = stable_read if full else int(share * stable_read)
        for _ in range(demand):
            assert c.pools.read.try_acquire(), (i, demand, c.pools.read.limit)
        for _ in range(demand):
            c.pools.read.release()
        c.on_interval(i / 10)


def test_what_bursts_added_decays_at_rest_never_below_initial_nor_under_twice_the_peak():
    p = ThroughputProber(ProbeSpec(initial=8, min=2, max=64), now=0.0)
    p.stable_concurrency = 40.0
    p.set_concurrency(40.0)
    t = 0.0
    for _ in range(QUIET - 1):
        t += 0.1
        p.run(t, rest(50, peak=15))
        assert p.get_current_concurrency() == 40  # nothing before a quiet spell is over
    t += 0.1
    p.run(t, rest(50, peak=18))  # target 40 x .9 = 36 >= 2 x 18: kept, EMA 36 x .2 + 40 x .8 = 39.2
    assert (p.stable_concurrency, p.get_current_concurrency()) == (pytest.approx(39.2), 39)
    for _ in range(QUIET):
        t += 0.1
        p.run(t, rest(50, peak=19))  # target 39.2 x .9 = 35.28 -> 35 < 2 x 19: not kept
    assert p.stable_concurrency == pytest.approx(39.2)
    for _ in range(100 * QUIET):
        t += 0.1
        assert p.run(t, rest(5, peak=1)) is S
    assert (p.stable_concurrency, p.get_current_concurrency()) == (8.0, 8)  # down to initial, no further


def test_bursts_grow_the_limit_a_step_per_interval_and_keep_what_covered_them():
    """At or below capacity a limit at the knee refuses the Poisson bursts above it, and one interval's
    throughput cannot show it: the probe up goes on while bursts exhaust the pools, and is kept when an
    interval passes without them exhausted."""
    p = ThroughputProber(ProbeSpec(initial=8, min=2, max=64), now=0.0)
    seen = []
    for i in range(1, 6):
        assert p.run(i / 10, burst(10)) is UP
        seen.append(p.get_current_concurrency())
    assert seen == [9, 10, 11, 12, 13]  # 8 x 1.1 -> 9 (one ticket at least), then 10 % a step
    assert p.stable_concurrency == 8  # not kept yet
    assert p.run(0.6, rest(10, peak=11)) is S  # covered: kept whole
    assert (p.stable_concurrency, p.get_current_concurrency()) == (13.0, 13)


def test_a_burst_probe_that_meets_saturation_goes_back():
    p = ThroughputProber(ProbeSpec(initial=8, min=2, max=64), now=0.0)
    p.run(0.1, burst(10))
    p.run(0.2, burst(10))
    assert p.get_current_concurrency() == 10
    assert p.run(0.3, overload(10)) is S  # saturated on the way: overload, not bursts
    assert (p.stable_concurrency, p.get_current_concurrency()) == (8.0, 8)


def test_refusals_lately_at_half_of_what_is_let_in_are_overload_not_bursts():
    """An interval not saturated by itself, after intervals that were: the seed's probe up (throughput decides)."""
    p = ThroughputProber(ProbeSpec(initial=8, min=2, max=64), now=0.0)
    for i in range(1, 11):
        p.run(i / 10, overload(10))
    assert p.state is S
    p.run(1.1, burst(10))  # refused lately ~ twice what was let in: not bursts
    assert p.state is UP and not p.growing


def test_bursts_at_the_maximum_change_nothing():
    p = ThroughputProber(ProbeSpec(initial=40, min=4, max=40), now=0.0)
    for i in range(1, 10):
        assert p.run(i / 10, burst(100)) is S
        assert p.get_current_concurrency() == 40


def test_throughput_is_tickets_returned_per_second_of_the_interval():
    p = ThroughputProber(SPEC, now=10.0)
    p.run(10.5, overload(100))
    assert p.stable_throughput == pytest.approx(200)
    assert p.run(10.5, overload(100)) is UP  # no time elapsed: nothing happens
    assert p.stable_throughput == pytest.approx(200)


def test_a_probe_that_would_round_to_no_change_moves_one_ticket():
    p = ThroughputProber(ProbeSpec(initial=4, min=2, max=64), now=0.0)
    assert p.run(1.0, overload(10)) is UP  # 4 x 1.1 = 4.4 would round back to 4
    assert p.get_current_concurrency() == 5
    p = ThroughputProber(ProbeSpec(initial=4, min=2, max=4), now=0.0)
    assert p.run(1.0, overload(10)) is DOWN  # at max: 4 x 0.9 = 3.6 -> 4: one less
    assert p.get_current_concurrency() == 3


@pytest.mark.parametrize(
    ("total", "ratio", "split"),
    [(32, 0.5, (16, 16)), (33, 0.5, (17, 16)), (40, 0.25, (10, 30)), (10, 0.0, (1, 9)), (10, 1.0, (9, 1))],
)
def test_the_ratio_split_keeps_one_ticket_for_each_kind(total: int, ratio: float, split: tuple[int, int]):
    assert split_concurrency(total, ratio) == split


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial": 4, "min": 1, "max": 8}, "min"),
        ({"initial": 4, "min": 8, "max": 4}, "max"),
        ({"initial": 2, "min": 4, "max": 8}, "initial"),
        ({"initial": 4, "min": 4, "max": 8, "read_write_ratio": 1.5}, "read_write_ratio"),
        ({"initial": 4, "min": 4, "max": 8, "step": 0.0}, "step"),
        ({"initial": 4, "min": 4, "max": 8, "ema_weight": 0.0}, "ema_weight"),
    ],
)
def test_parameters_that_cannot_work_are_refused_by_name(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        ProbeSpec(**kwargs)


# -- scripted throughput curves ----------------------------------------------------------------------------


def knee(concurrency: int, at: int = 64) -> float:
    """An upstream's throughput (per s) at a concurrency: 10/s per ticket up to the knee, worse past it."""
    return 10.0 * concurrency if concurrency <= at else 10.0 * at - 5.0 * (concurrency - at)


def drive(p: ThroughputProber, demand: float, intervals: int, curve=knee) -> list[int]:  # noqa: ANN001
    """``demand`` requests always want to run (twice what the limit lets in are refused when it is below
    the demand). One interval a second, so that throughputs compare exactly (no float noise)."""
    seen = []
    for i in range(1, intervals + 1):
        busy = int(min(demand, p.get_current_concurrency()))
        done = round(curve(busy))
        exhausted = busy >= p.get_current_concurrency()
        p.run(float(i), Interval(done, exhausted, busy, done, 2 * done if exhausted else 0))
        seen.append(p.get_current_concurrency())
    return seen


def test_it_climbs_to_the_knee_while_tickets_are_exhausted_and_throughput_rises():
    p = ThroughputProber(ProbeSpec(initial=16, min=4, max=256), now=0.0)
    seen = drive(p, demand=float("inf"), intervals=600)
    assert seen[0] == 18  # the first probe up
    assert 55 <= p.stable_concurrency <= 70  # the knee is at 64
    assert max(seen[300:]) <= 76  # probes past the knee are taken back
    assert all(4 <= c <= 256 for c in seen)


def test_it_comes_back_when_throughput_does_not_rise():
    """A flat curve: every probe up finds nothing, so the stable concurrency never moves."""
    p = ThroughputProber(ProbeSpec(initial=20, min=4, max=256), now=0.0)
    seen = drive(p, demand=float("inf"), intervals=200, curve=lambda c: 500.0)
    assert p.stable_concurrency == 20
    assert set(seen) == {22, 20}  # up, back, up, back


def test_the_maximum_bounds_the_climb():
    p = ThroughputProber(ProbeSpec(initial=16, min=4, max=40), now=0.0)
    seen = drive(p, demand=float("inf"), intervals=400)
    assert max(seen) == 40
    assert p.stable_concurrency <= 40


def test_probed_limits_drive_real_pools_without_stranding_waiters():
    """The loop the wiring runs each interval: the pools' report in, the prober's limits out, and the waiters
    a larger limit grants handed back."""
    c = EndpointConcurrency(
        ProbeSpec(initial=4, min=2, max=16), now=0.0, probing=True, max_queue=100, max_wait=10
    )
    waiters = [c.pools.read.acquire(0.0) for _ in range(6)]
    assert [w.admitted for w in waiters] == [True, True, False, False, False, False]
    granted = c.on_interval(0.1)  # saturated: 4 x 1.1 rounds to 4, so one more ticket, a read (half up)
    assert (c.probe_state, c.pools.read.limit, c.pools.write.limit) == (UP, 3, 2)
    assert granted == [(Kind.READ, waiters[2].waiter)]
    for _ in range(3):
        c.pools.read.release()  # throughput: 30 tickets/s, up from 0
    assert c.on_interval(0.2) == []  # the probe found more throughput: EMA 4 x .8 + 5 x .2 = 4.2 -> 4
    assert (c.probe_state, c.prober.stable_concurrency) == (S, pytest.approx(4.2))  # type: ignore[union-attr]
    assert (c.pools.read.limit, c.pools.write.limit, c.pools.read.in_use) == (2, 2, 3)  # drains to 2


def test_fixed_limits_never_move():
    c = EndpointConcurrency(
        ProbeSpec(initial=4, min=2, max=16), now=0.0, probing=False, max_queue=10, max_wait=1
    )
    for _ in range(3):
        c.pools.write.acquire(0.0)
    for i in range(1, 20):
        assert c.on_interval(i / 10) == []
        assert (c.probe_state, c.pools.read.limit, c.pools.write.limit) == (S, 2, 2)


def test_a_reconfigure_keeps_holders_and_waiters_and_grants_by_the_new_limits():
    c = EndpointConcurrency(
        ProbeSpec(initial=4, min=2, max=16), now=0.0, probing=False, max_queue=10, max_wait=1
    )
    first = [c.pools.read.acquire(0.0) for _ in range(5)]
    assert [d.admitted for d in first] == [True, True, False, False, False]
    granted = c.reconfigure(ProbeSpec(initial=8, min=2, max=16), 1.0, probing=True, max_queue=1, max_wait=5)
    assert granted == [(Kind.READ, first[2].waiter), (Kind.READ, first[3].waiter)]  # 4 read tickets now
    assert (c.pools.read.limit, c.pools.read.in_use, c.pools.read.queued) == (4, 4, 1)
    assert c.pools.read.acquire(1.0).rejected  # the new max_queue (1) for new waiters; the old one stays
    assert c.probe_state is S and c.prober is not None and c.prober.limits == (4, 4)
    assert (
        c.reconfigure(ProbeSpec(initial=2, min=2, max=2), 2.0, probing=False) == []
    )  # smaller: none revoked
    assert (c.pools.read.limit, c.pools.read.in_use, c.prober) == (1, 4, None)
    assert c.pools.read.release() == 0 and c.pools.read.release() == 0 and c.pools.read.release() == 0
    assert c.pools.read.release() == first[4].waiter  # back under the limit: the waiter gets the ticket


def test_resume_starts_a_fresh_interval_after_an_idle_stretch():
    c = EndpointConcurrency(
        ProbeSpec(initial=4, min=2, max=16), now=0.0, probing=True, max_queue=10, max_wait=1
    )
    c.pools.read.acquire(0.0)
    c.pools.read.release()
    c.resume(100.0)  # the ticket returned long ago and the idle stretch are not this interval's measure
    c.pools.write.acquire(100.0)
    c.pools.write.acquire(100.0)
    c.pools.write.acquire(100.0)  # refused (2 write tickets): exhausted, one refused for two let in
    c.on_interval(100.1)  # stable: 0 returned in this interval (not 1 over 100 s): probe up
    assert c.probe_state is UP and c.prober is not None and c.prober.stable_throughput == 0.0


@FAST
@given(
    st.integers(2, 20),
    st.integers(0, 200),
    st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.8, 1.0]),
    st.sampled_from([0.05, 0.1, 0.5]),
    st.sampled_from([0.1, 0.2, 1.0]),
    st.lists(st.tuples(st.integers(0, 5000), st.booleans(), st.integers(0, 200)), max_size=200),
)
def test_limits_never_leave_min_max_and_keep_the_ratio(low, extra, ratio, step, weight, script):
    spec = ProbeSpec(
        initial=low, min=low, max=low + extra, read_write_ratio=ratio, step=step, ema_weight=weight
    )
    p = ThroughputProber(spec, now=0.0)
    for i, (returned, exhausted, refused) in enumerate(script, start=1):
        p.run(i * 0.1, Interval(returned, exhausted, returned // 50, returned // 100, refused))
        read, write = p.limits
        assert spec.min <= read + write <= spec.max
        assert read >= 1 and write >= 1
        assert abs(read - (read + write) * ratio) <= 1.0
        assert spec.min <= p.stable_concurrency <= spec.max


def test_a_burst_probe_grows_to_what_the_interval_demanded():
    """Ten let in and four turned away: the limit that would have let all in is 8 x 14 / 10 = 11.2 -> 11,
    more than a step (8 x 1.1 -> 9)."""
    p = ThroughputProber(ProbeSpec(initial=8, min=2, max=64), now=0.0)
    assert p.run(0.1, Interval(10, True, peak=8, admitted=10, refused=2, queued=2)) is UP
    assert p.get_current_concurrency() == 11
    assert p.run(0.2, Interval(10, True, peak=11, admitted=10, refused=5)) is UP  # 11 x 1.5 = 16.5 -> 17
    assert p.get_current_concurrency() == 17
    assert p.run(0.3, rest(10, peak=12)) is S
    assert p.stable_concurrency == 17
