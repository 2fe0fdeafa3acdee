"""Backoff delays: d_i = min(max, initial * multiplier**i), then jitter."""

import pytest

from sidecar.policy import BackoffSpec, Jitter
from sidecar.policy.backoff import BackoffSequence, ceiling
from tests.unit.playbook import scripted

NEVER = scripted()  # a rand that must not be drawn
MONGO = BackoffSpec(initial=0.1, max=10.0, multiplier=2.0, jitter=Jitter.FULL)


def draw(spec: BackoffSpec, n: int, rand=lambda: 1.0) -> list[float]:
    seq = BackoffSequence(spec)
    return [seq.next(rand) for _ in range(n)]


def test_mongodb_sequence_with_jitter_fixed_at_one():
    assert draw(MONGO, 5) == [0.1, 0.2, 0.4, 0.8, 1.6]
    no_jitter = BackoffSpec(initial=0.1, max=10.0, multiplier=2.0, jitter=Jitter.NONE)
    assert draw(no_jitter, 5, rand=NEVER) == [0.1, 0.2, 0.4, 0.8, 1.6]


@pytest.mark.parametrize(
    ("initial", "max_", "multiplier"),
    [
        (0.1, 10.0, 2.0),
        (0.025, 1.0, 2.0),
        (1.0, 120.0, 1.6),
        (0.3, 7.0, 1.5),
        (0.05, 0.05, 3.0),
        (2.0, 30.0, 1.0),
    ],
)
def test_grpc_a6_recurrence_gives_the_same_numbers(initial, max_, multiplier):
    spec = BackoffSpec(initial=initial, max=max_, multiplier=multiplier, jitter=Jitter.NONE)
    a6, current = [], initial
    for _ in range(25):
        a6.append(current)
        current = min(current * multiplier, max_)
    assert draw(spec, 25) == a6
    assert [ceiling(spec, i) for i in range(25)] == a6


def test_ceiling_is_the_closed_formula():
    spec = BackoffSpec(initial=0.3, max=7.0, multiplier=1.5)
    for i in range(20):
        assert ceiling(spec, i) == pytest.approx(min(7.0, 0.3 * 1.5**i))


def test_ceiling_does_not_overflow_for_huge_index():
    assert ceiling(BackoffSpec(initial=0.1, max=3.0, multiplier=10.0), 100_000) == 3.0


def test_full_jitter_is_rand_times_d():
    assert draw(MONGO, 3, rand=scripted(0.5, 0.25, 0.0)) == [0.05, 0.05, 0.0]


def test_equal_jitter_is_half_plus_rand_half():
    spec = BackoffSpec(initial=1.0, max=10.0, multiplier=2.0, jitter=Jitter.EQUAL)
    assert draw(spec, 3, rand=scripted(0.0, 0.5, 1.0)) == [0.5, 1.5, 4.0]


def test_proportional_jitter_stays_within_80_to_120_percent():
    spec = BackoffSpec(initial=1.0, max=10.0, multiplier=2.0, jitter=Jitter.PROPORTIONAL)
    assert draw(spec, 3, rand=scripted(0.0, 0.5, 1.0)) == pytest.approx([0.8, 2.0, 4.8], abs=1e-12)


def test_decorrelated_jitter_draws_between_base_and_previous_times_multiplier():
    spec = BackoffSpec(initial=1.0, max=5.0, multiplier=3.0, jitter=Jitter.DECORRELATED)
    # uniform(1, 1*3) -> 2; uniform(1, 2*3) -> 1 + 0.5*5 = 3.5; uniform(1, 10.5) capped at 5
    assert draw(spec, 3, rand=scripted(0.5, 0.5, 1.0)) == [2.0, 3.5, 5.0]


def test_reset_starts_the_sequence_again():
    seq = BackoffSequence(BackoffSpec(initial=0.1, max=10.0, jitter=Jitter.NONE))
    assert [seq.next(NEVER), seq.next(NEVER), seq.next(NEVER)] == [0.1, 0.2, 0.4]
    seq.reset()
    assert [seq.next(NEVER), seq.next(NEVER)] == [0.1, 0.2]


def test_reset_also_restarts_decorrelated_from_base():
    seq = BackoffSequence(BackoffSpec(initial=1.0, max=100.0, multiplier=3.0, jitter=Jitter.DECORRELATED))
    seq.next(lambda: 1.0)
    seq.next(lambda: 1.0)  # previous is now 9
    seq.reset()
    assert seq.next(lambda: 1.0) == 3.0  # uniform(1, 1*3), not uniform(1, 27)


def test_rebase_replaces_initial_for_the_rest_of_the_sequence():
    seq = BackoffSequence(BackoffSpec(initial=0.1, max=10.0, jitter=Jitter.NONE))
    assert seq.next(NEVER) == 0.1
    seq.rebase(0.5)
    assert [seq.next(NEVER), seq.next(NEVER)] == [1.0, 2.0]  # i=1 and i=2 on the new base


@pytest.mark.parametrize(
    "kwargs", [{"initial": -0.1}, {"max": -1.0}, {"multiplier": 0.5}], ids=["initial", "max", "multiplier"]
)
def test_spec_rejects_nonsense(kwargs):
    with pytest.raises(ValueError):
        BackoffSpec(**kwargs)
