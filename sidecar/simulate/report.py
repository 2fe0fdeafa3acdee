"""The report of a simulation: a per-second table per strategy, a summary line each, and one JSON object."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from .record import Record, percentile
from .scenario import Scenario
from .summary import AFTER_WINDOW, RECOVERY_SHARE, RECOVERY_WINDOW, Summary, summarize

MAX_ROWS = 120  # longer runs are shown in steps of several seconds


@dataclass(frozen=True, slots=True)
class Result:
    strategy: str
    record: Record
    summary: Summary


@dataclass(frozen=True, slots=True)
class Report:
    scenario: Scenario
    engine: str
    results: list[Result]

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.name,
            "engine": self.engine,
            "duration": self.scenario.duration,
            "machine": machine(),
            "strategies": {r.strategy: r.summary.to_json() for r in self.results},
        }


def result(strategy: str, record: Record, scenario: Scenario) -> Result:
    return Result(strategy, record, summarize(strategy, record, scenario))


def machine() -> dict[str, Any]:
    return {"cores": os.cpu_count() or 1}


HEADER = (
    f"{'t':>5} {'offered':>7} {'ok/s':>6} {'err/s':>6} {'tmo/s':>6} {'att/s':>7} "
    f"{'inflight':>8} {'p50 ms':>8} {'p99 ms':>8}"
)


def table(res: Result, scenario: Scenario) -> list[str]:
    """Rows of whole seconds (or steps of several, rates per second averaged, in-flight the highest);
    ``*`` marks the seconds of the outage."""
    seconds = res.record.seconds
    step = max(1, math.ceil(len(seconds) / MAX_ROWS))
    o = scenario.outage
    lines = [HEADER if step == 1 else f"{HEADER}   (rows of {step} s, rates per second)"]
    for a in range(0, len(seconds), step):
        chunk = seconds[a : a + step]
        n = len(chunk)
        lat = [x for s in chunk for x in s.latencies]
        mark = "*" if o is not None and a < o.end and a + n > o.start else " "
        p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
        lines.append(
            f"{a:>4}{mark} {_rate(chunk, 'offered', n):>7} {_rate(chunk, 'ok', n):>6} "
            f"{_rate(chunk, 'errors', n):>6} {_rate(chunk, 'timeouts', n):>6} {_rate(chunk, 'attempts', n):>7} "
            f"{max(s.inflight for s in chunk):>8} {_ms(p50):>8} {_ms(p99):>8}"
        )
    return lines


def _rate(chunk: list[Any], name: str, n: int) -> str:
    v = sum(getattr(s, name) for s in chunk) / n
    return f"{v:.0f}" if n == 1 or v >= 100 else f"{v:.1f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def summary_line(res: Result, scenario: Scenario) -> str:
    s = res.summary
    limit = scenario.server.limit * scenario.server.replicas
    parts = [f"{res.strategy}:"]
    o = scenario.outage
    if o is not None:
        if s.recovered:
            parts.append(f"recovered {s.recovery_s:.0f} s after the {o.mode} ended;")
        else:
            left = max(0.0, scenario.duration - o.end - RECOVERY_WINDOW)
            parts.append(f"NOT recovered ({left:.0f} s after the {o.mode} ended);")
    parts.append(f"peak in-flight {s.peak_inflight} ({s.peak_inflight / limit:.1f}x the limit);")
    if o is not None:
        parts.append(
            f"amplification {_x(s.amplification_outage)} during the {o.mode}, "
            f"{_x(s.amplification_after)} in the {AFTER_WINDOW} s after;"
        )
    else:
        parts.append(f"amplification {_x(s.amplification)};")
    sr = "-" if s.success_rate is None else f"{100 * s.success_rate:.2f}%"
    parts.append(f"success {sr}; p50 {_ms(s.p50_ms)} ms, p99 {_ms(s.p99_ms)} ms, p99.9 {_ms(s.p999_ms)} ms")
    return " ".join(parts)


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def render(report: Report, with_tables: bool = True) -> list[str]:
    sc = report.scenario
    lines = [
        f"scenario {sc.name} on the {report.engine} engine, {sc.duration:.0f} s, {machine()['cores']} cores"
    ]
    if sc.description:
        lines.append(f"  {' '.join(sc.description.split())}")
    if with_tables:
        for r in report.results:
            lines += ["", f"== {r.strategy}", *table(r, sc)]
    lines += [
        "",
        "summary (recovered: goodput back to "
        f"{RECOVERY_SHARE:.0%} of its level before the outage over {RECOVERY_WINDOW} s):",
    ]
    lines += [f"  {summary_line(r, sc)}" for r in report.results]
    return lines
