"""How a client that retries by itself waits between attempts: the seed's two strategies, pure.

``fixed``: the same interval after every failure. ``backoff``: the seed's pseudo-code, starting from
``min_delay``: ``delay = min(delay * factor, max_delay); delay += normal(0, delay * jitter)``.
Randomness comes in (a ``random.Random``), so both engines and the tests draw the same numbers from a seed.
"""

from __future__ import annotations

import random

from .scenario import ClientsSpec


class Waits:
    """The waits of one request's retries: ``next()`` after each failed attempt."""

    __slots__ = ("strategy", "spec", "rand", "delay")

    def __init__(self, strategy: str, spec: ClientsSpec, rand: random.Random) -> None:
        if strategy not in ("fixed", "backoff"):
            raise ValueError(f"clients retry by themselves only with fixed or backoff, not {strategy!r}")
        self.strategy = strategy
        self.spec = spec
        self.rand = rand
        self.delay = spec.backoff.min_delay

    def next(self) -> float:
        if self.strategy == "fixed":
            return self.spec.fixed_interval
        b = self.spec.backoff
        d = min(self.delay * b.factor, b.max_delay)
        if b.jitter:
            d += self.rand.gauss(0.0, d * b.jitter)
        self.delay = max(0.0, d)
        return self.delay


def mean_gap(spec: ClientsSpec) -> float:
    """Each client's mean wait between requests, so that all of them together offer ``rate`` per second."""
    return spec.count / spec.rate
