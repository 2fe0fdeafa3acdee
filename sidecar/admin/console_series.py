"""The console's last five minutes: one point a second, read from the counters the sidecar keeps anyway.

A :class:`Sampler` runs once a second on the loop (one timer for the process, never per request): it reads
each (listener, upstream) pair's ``Meters`` (the numbers ``/metrics`` exports) and each endpoint's ticket
pools, and turns what changed since the last second into rates: requests/s, the share of them that
succeeded, upstream attempts per request (amplification), retries/s and p50/p99 (from the latency histogram's
buckets, interpolated as Prometheus' ``histogram_quantile`` does). The last second's figures, retries by
cause among them, are what the console's tables show; the rings are its charts.

Bounded: :data:`POINTS` points per line in fixed arrays (4 bytes a value, 8 for the times): 7.2 KiB per
(listener, upstream) pair, 2.4 KiB per charted endpoint, at most :data:`CHARTED_ENDPOINTS` endpoints per
upstream (the first seen; the tables show every endpoint). A line whose pair or endpoint is gone (a reload, a
changed endpoint set) is dropped once its points have all scrolled out.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, Final

#: Points kept per line: five minutes at one a second.
POINTS: Final = 300
#: Endpoints charted per upstream (their concurrency limit and tickets in use).
CHARTED_ENDPOINTS: Final = 32
#: Seconds of per-endpoint outcome counts the console sums as "recent".
RECENT: Final = 10
PAIR_LINES: Final = ("rps", "success", "amplification", "retries", "p50", "p99")
ENDPOINT_LINES: Final = ("limit", "in_use")
NAN: Final = math.nan


def quantile(bounds: Sequence[float], counts: Sequence[int], q: float) -> float:
    """The ``q`` quantile of a histogram's observations (``counts[i]`` at most ``bounds[i]``; the last count
    past every bound), interpolated within its bucket as Prometheus' ``histogram_quantile``: from the
    bucket's lower bound (0 for the first), and the highest finite bound for the +Inf bucket. NaN when
    empty."""
    total = sum(counts)
    if total <= 0:
        return NAN
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i >= len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i > 0 else 0.0
            return lower + (bounds[i] - lower) * (rank - seen) / n
        seen += n
    return bounds[-1]


class Ring:
    """``POINTS`` values indexed by sample number (sample ``i`` in slot ``i % POINTS``)."""

    __slots__ = ("values", "last_set")

    def __init__(self, typecode: str = "f") -> None:
        self.values = array(typecode, [NAN]) * POINTS
        self.last_set = -1

    def set(self, i: int, value: float) -> None:
        self.values[i % POINTS] = value
        self.last_set = i

    def since(self, first: int, count: int) -> list[float | None]:
        """Samples ``first`` .. ``count - 1`` (NaN as ``None``: JSON has no NaN)."""
        out: list[float | None] = []
        for i in range(first, count):
            v = self.values[i % POINTS]
            out.append(None if v != v else round(v, 4))
        return out


class _Previous:
    """A pair's cumulative numbers at the last sample."""

    __slots__ = (
        "requests",
        "success",
        "attempts",
        "retries",
        "by_cause",
        "hedges",
        "throttled",
        "deadline",
        "buckets",
    )

    @classmethod
    def zero(cls, buckets: int) -> _Previous:
        """Before a pair's first request: every count it has is new."""
        p = cls.__new__(cls)
        p.requests = p.success = p.attempts = p.retries = p.hedges = p.throttled = p.deadline = 0
        p.by_cause = {}
        p.buckets = [0] * buckets
        return p

    def __init__(self, m: Any) -> None:
        self.requests = sum(m.requests.values())
        self.success = m.requests.get("success", 0)
        self.attempts = sum(m.attempts.values())
        self.by_cause: dict[str, int] = dict(m.retries)
        self.retries = sum(self.by_cause.values())
        self.hedges = m.hedges
        self.throttled = m.throttled
        self.deadline = m.deadline_expired
        self.buckets: list[int] = list(m.duration.counts)


class Sampler:
    """The rings and the last second's figures. ``sample`` is called once a second (``Console`` arms it)."""

    def __init__(self) -> None:
        #: Samples taken so far; sample ``i`` (0-based) is at ``times[i % POINTS]``.
        self.count = 0
        self.times = Ring("d")
        self.pairs: dict[tuple[str, str], dict[str, Ring]] = {}
        self.endpoints: dict[tuple[str, str], dict[str, Ring]] = {}
        #: The last second's figures per pair (``Console``'s tables): rates per second, ratios, milliseconds.
        self.last: dict[tuple[str, str], dict[str, Any]] = {}
        #: Requests refused at each listener's door in the last second.
        self.refused_last: dict[str, float] = {}
        #: Outcome counts per upstream and endpoint, one entry a second (only while the tap is armed).
        self.outcomes: deque[dict[str, dict[str, list[int]]]] = deque(maxlen=RECENT)
        self._prev: dict[tuple[str, str], _Previous] = {}
        self._prev_refused: dict[str, int] = {}
        self._prev_at = NAN

    def sample(
        self,
        wall: float,
        mono: float,
        meters: Iterable[tuple[tuple[str, str], Any]],
        pools: Iterable[tuple[str, str, int, int]],
        refused: Iterable[tuple[str, int]],
        outcomes: dict[str, dict[str, list[int]]],
    ) -> None:
        """One point: ``meters`` each pair's ``Meters``; ``pools`` (upstream, endpoint, limit, in use) for the
        endpoints with ticket pools; ``refused`` each listener's refusals so far; ``outcomes`` the tap's
        per-endpoint outcome counts since the last call."""
        i = self.count
        self.times.set(i, wall)
        elapsed = mono - self._prev_at
        if not elapsed > 0:  # the first sample has nothing to compare with (NaN)
            elapsed = NAN
        for key, m in meters:
            self._pair(i, key, m, elapsed)
        charted: dict[str, int] = {}
        for upstream, endpoint, limit, in_use in pools:
            key = (upstream, endpoint)
            lines = self.endpoints.get(key)
            if lines is None:
                if charted.get(upstream, 0) >= CHARTED_ENDPOINTS:
                    continue
                lines = self.endpoints[key] = {name: Ring() for name in ENDPOINT_LINES}
            charted[upstream] = charted.get(upstream, 0) + 1
            lines["limit"].set(i, limit)
            lines["in_use"].set(i, in_use)
        for listener, n in refused:
            before = self._prev_refused.get(listener)
            self._prev_refused[listener] = n
            self.refused_last[listener] = (n - before) / elapsed if before is not None else NAN
        self.outcomes.append(outcomes)
        self._prev_at = mono
        self.count = i + 1
        self._forget(self.pairs, i)
        self._forget(self.endpoints, i)

    def _pair(self, i: int, key: tuple[str, str], m: Any, elapsed: float) -> None:
        now = _Previous(m)
        before = self._prev.get(key)
        self._prev[key] = now
        lines = self.pairs.get(key)
        if lines is None:
            lines = self.pairs[key] = {name: Ring() for name in PAIR_LINES}
        if before is None:  # at the first sample, nothing to compare with; later, a pair born since the last
            before = now if elapsed != elapsed else _Previous.zero(len(now.buckets))
        requests = now.requests - before.requests
        buckets = [a - b for a, b in zip(now.buckets, before.buckets, strict=True)]
        bounds = m.duration.bounds
        figures: dict[str, Any] = {
            "rps": requests / elapsed,
            "success": (now.success - before.success) / requests if requests else NAN,
            "amplification": (now.attempts - before.attempts) / requests if requests else NAN,
            "retries": (now.retries - before.retries) / elapsed,
            "p50": quantile(bounds, buckets, 0.5) * 1000.0,
            "p99": quantile(bounds, buckets, 0.99) * 1000.0,
        }
        for name in PAIR_LINES:
            lines[name].set(i, figures[name])
        figures["retries_by_cause"] = {
            cause: (n - before.by_cause.get(cause, 0)) / elapsed for cause, n in sorted(now.by_cause.items())
        }
        figures["hedges"] = (now.hedges - before.hedges) / elapsed
        figures["throttled"] = (now.throttled - before.throttled) / elapsed
        figures["deadline_expired"] = (now.deadline - before.deadline) / elapsed
        self.last[key] = figures

    def _forget(self, lines: dict[Any, dict[str, Ring]], i: int) -> None:
        """Drop the lines not set for a whole ring's length (their pair or endpoint is gone)."""
        if i % 60:
            return
        for key in [k for k, rings in lines.items() if next(iter(rings.values())).last_set <= i - POINTS]:
            del lines[key]

    def recent_outcomes(self, upstream: str) -> dict[str, list[int]]:
        """Each endpoint's outcome counts over the last :data:`RECENT` samples (while the tap was armed)."""
        out: dict[str, list[int]] = {}
        for second in self.outcomes:
            for endpoint, counts in second.get(upstream, {}).items():
                total = out.get(endpoint)
                if total is None:
                    out[endpoint] = list(counts)
                else:
                    for j, n in enumerate(counts):
                        total[j] += n
        return out

    def series(self, since: int) -> dict[str, Any]:
        """The points after sample number ``since`` (all kept ones for ``since < 0`` or one too old)."""
        first = max(since + 1, self.count - POINTS, 0)
        pairs = [
            {
                "listener": lst,
                "upstream": up,
                **{name: ring.since(first, self.count) for name, ring in rings.items()},
            }
            for (lst, up), rings in sorted(self.pairs.items())
        ]
        endpoints = [
            {
                "upstream": up,
                "endpoint": ep,
                **{name: ring.since(first, self.count) for name, ring in rings.items()},
            }
            for (up, ep), rings in sorted(self.endpoints.items())
        ]
        return {
            "first": first,
            "next": self.count,
            "t": self.times.since(first, self.count),
            "pairs": pairs,
            "endpoints": endpoints,
        }
