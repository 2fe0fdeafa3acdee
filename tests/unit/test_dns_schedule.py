"""When a name is resolved again (``sidecar/upstream/schedule.py``), played as a transcript: each result in,
the wait until the next resolution out, with a scripted ``rand`` (the jitter's draw)."""

from __future__ import annotations

import pytest

from sidecar.upstream.resolution import EMPTY, ERROR, OK
from sidecar.upstream.schedule import RefreshSchedule, RefreshSpec
from tests.unit.playbook import scripted

NO_JITTER = RefreshSpec(refresh=5.0, respect_ttl=False, failure_refresh=1.0, jitter=0.0)


def play(
    spec: RefreshSpec, results: list[tuple[str, float | None]], draws: tuple[float, ...] = ()
) -> list[float]:
    """The waits after each ``(result, ttl)`` in turn."""
    schedule = RefreshSchedule(spec)
    rand = scripted(*draws) if draws else scripted()
    return [schedule.after(result, ttl, rand) for result, ttl in results]


def test_an_answer_is_followed_by_the_refresh_whatever_its_ttl() -> None:
    assert play(NO_JITTER, [(OK, 30.0), (OK, 0.0), (EMPTY, None)]) == [5.0, 5.0, 5.0]


def test_failures_in_a_row_double_the_wait_up_to_refresh_and_an_answer_resets_it() -> None:
    results = [(ERROR, None)] * 5 + [(OK, None), (ERROR, None)]
    assert play(NO_JITTER, results) == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 1.0]


def test_an_empty_answer_is_an_answer_not_a_failure() -> None:
    assert play(NO_JITTER, [(ERROR, None), (ERROR, None), (EMPTY, None), (ERROR, None)]) == [
        1.0,
        2.0,
        5.0,
        1.0,
    ]


@pytest.mark.parametrize(
    ("ttl", "wait"),
    [(3.0, 3.0), (0.0, 1.0), (0.4, 1.0), (60.0, 5.0), (None, 5.0)],
    ids=["within", "zero-is-1s", "short-is-1s", "long-is-refresh", "no-ttl"],
)
def test_respect_ttl_waits_for_the_ttl_within_one_second_and_refresh(ttl: float | None, wait: float) -> None:
    spec = RefreshSpec(refresh=5.0, respect_ttl=True, failure_refresh=1.0, jitter=0.0)
    assert play(spec, [(OK, ttl)]) == [wait]


def test_respect_ttl_with_a_refresh_under_a_second_keeps_to_refresh() -> None:
    spec = RefreshSpec(refresh=0.5, respect_ttl=True, failure_refresh=0.2, jitter=0.0)
    assert play(spec, [(OK, 0.0), (OK, 10.0)]) == [0.5, 0.5]


def test_a_failure_does_not_follow_the_ttl_of_the_last_answer() -> None:
    spec = RefreshSpec(refresh=5.0, respect_ttl=True, failure_refresh=1.0, jitter=0.0)
    assert play(spec, [(OK, 3.0), (ERROR, None), (EMPTY, None)]) == [3.0, 1.0, 5.0]


def test_jitter_adds_a_random_part_of_itself_to_every_wait() -> None:
    spec = RefreshSpec(refresh=5.0, respect_ttl=False, failure_refresh=1.0, jitter=2.0)
    assert play(spec, [(OK, None), (ERROR, None), (ERROR, None)], draws=(0.5, 0.0, 0.999)) == pytest.approx(
        [6.0, 1.0, 2.0 + 1.998]
    )
