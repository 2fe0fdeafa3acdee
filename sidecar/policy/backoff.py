"""Backoff delays: the exponential sequence and its jitter. Randomness comes in as ``rand() -> [0, 1)``."""

from __future__ import annotations

from collections.abc import Callable

from .spec import BackoffSpec, Jitter

Rand = Callable[[], float]


def ceiling(spec: BackoffSpec, i: int, base: float | None = None) -> float:
    """The un-jittered i-th delay (i = 0 for the first backoff): ``min(max, base * multiplier**i)``."""
    b = spec.initial if base is None else base
    # Stop multiplying once past the cap: multiplier**i overflows long before i runs out.
    d = b
    for _ in range(i):
        if d >= spec.max:
            break
        d *= spec.multiplier
    return min(spec.max, d)


class BackoffSequence:
    """Per-request backoff state: which step comes next, and the previous delay (for decorrelated)."""

    __slots__ = ("spec", "index", "base", "previous")

    def __init__(self, spec: BackoffSpec) -> None:
        self.spec = spec
        self.index = 0
        self.base = spec.initial
        self.previous = spec.initial

    def next(self, rand: Rand) -> float:
        spec = self.spec
        d = ceiling(spec, self.index, self.base)
        self.index += 1
        j = spec.jitter
        if j is Jitter.FULL:
            delay = rand() * d
        elif j is Jitter.EQUAL:
            delay = d / 2 + rand() * d / 2
        elif j is Jitter.PROPORTIONAL:
            delay = d * (0.8 + 0.4 * rand())
        elif j is Jitter.DECORRELATED:
            low = self.base
            high = max(low, self.previous * spec.multiplier)
            delay = min(spec.max, low + rand() * (high - low))
        else:
            delay = d
        self.previous = delay
        return delay

    def reset(self) -> None:
        """Start the sequence again (after a server pushback, per gRPC A6)."""
        self.index = 0
        self.previous = self.base

    def rebase(self, base: float) -> None:
        """Use a server-sent base from now on (MongoDB ``baseBackoffMS``)."""
        self.base = base
        if self.index == 0:
            self.previous = base
