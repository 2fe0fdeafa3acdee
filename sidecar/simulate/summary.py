"""The summary of one strategy's run, computed from its per-second :class:`~.record.Record`.

Definitions (docs/simulate.md repeats them):

* ``baseline``: mean goodput (ok/s) from the end of the warmup to the start of the outage (to the end of
  the run when there is none).
* ``recovery_s``: ``t - outage end`` for the first whole second ``t >= outage end`` whose next
  ``RECOVERY_WINDOW`` seconds have a mean goodput of at least 95% of the baseline; ``None`` when that never
  happens before the run ends (then ``recovered`` is false). Without an outage, ``recovered`` is true and
  ``recovery_s`` is ``None``.
* ``amplification`` over a window: upstream attempts sent in it / client requests started in it.
  ``amplification_outage`` covers the outage, ``amplification_after`` the ``AFTER_WINDOW`` seconds after it
  (or to the end of the run), ``amplification`` everything after the warmup.
* ``success_rate``: client requests that succeeded / (those that ended + those still open at the end that
  started more than a client timeout before it).
* ``p50_ms``, ``p99_ms``, ``p999_ms``: nearest-rank percentiles of the time client requests took, over
  every request that ended (success or not).
* ``peak_inflight``: the most requests the server (all replicas) held at once.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .record import Record, percentile
from .scenario import Scenario

RECOVERY_WINDOW = 5
RECOVERY_SHARE = 0.95
AFTER_WINDOW = 30


@dataclass(frozen=True, slots=True)
class Summary:
    strategy: str
    recovered: bool
    recovery_s: float | None
    peak_inflight: int
    amplification_outage: float | None
    amplification_after: float | None
    amplification: float | None
    success_rate: float | None
    p50_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    baseline_goodput: float
    requests: int

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        del d["strategy"]
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}


def window(rec: Record, start: float, end: float) -> tuple[int, int]:
    """Whole seconds ``[start, end)`` clipped to the run, as indices."""
    n = len(rec.seconds)
    return max(0, min(n, math.floor(start))), max(0, min(n, math.ceil(end)))


def amplification(rec: Record, start: float, end: float) -> float | None:
    a, b = window(rec, start, end)
    seconds = rec.seconds[a:b]
    offered = sum(s.offered for s in seconds)
    return sum(s.attempts for s in seconds) / offered if offered else None


def goodput(rec: Record, start: float, end: float) -> float:
    a, b = window(rec, start, end)
    return sum(s.ok for s in rec.seconds[a:b]) / (b - a) if b > a else 0.0


def recovery(rec: Record, baseline: float, outage_end: float) -> float | None:
    n = len(rec.seconds)
    for t in range(math.ceil(outage_end), n - RECOVERY_WINDOW + 1):
        if goodput(rec, t, t + RECOVERY_WINDOW) >= RECOVERY_SHARE * baseline:
            return float(t - outage_end)
    return None


def summarize(strategy: str, rec: Record, scenario: Scenario) -> Summary:
    duration = len(rec.seconds)
    o = scenario.outage
    baseline = goodput(rec, scenario.warmup, o.start if o is not None else duration)
    if o is not None:
        rec_s = recovery(rec, baseline, o.end)
        recovered = rec_s is not None
        amp_outage = amplification(rec, o.start, o.end)
        amp_after = amplification(rec, o.end, o.end + AFTER_WINDOW)
    else:
        rec_s, recovered, amp_outage, amp_after = None, True, None, None
    ok = sum(s.ok for s in rec.seconds)
    ended = ok + sum(s.failed for s in rec.seconds)
    denominator = ended + rec.unfinished_old
    latencies = [x for s in rec.seconds for x in s.latencies]
    return Summary(
        strategy=strategy,
        recovered=recovered,
        recovery_s=rec_s,
        peak_inflight=max((s.inflight for s in rec.seconds), default=0),
        amplification_outage=amp_outage,
        amplification_after=amp_after,
        amplification=amplification(rec, scenario.warmup, duration),
        success_rate=ok / denominator if denominator else None,
        p50_ms=percentile(latencies, 0.50),
        p99_ms=percentile(latencies, 0.99),
        p999_ms=percentile(latencies, 0.999),
        baseline_goodput=baseline,
        requests=sum(s.offered for s in rec.seconds),
    )
