"""The demo's load generator and live table, shared by every protocol part.

A part supplies the protocol bits (:class:`DemoPart`): start upstreams and a sidecar, send one request
through it. The runner paces requests (Poisson arrivals at ``rate``/s), measures what the client saw, reads
what the sidecar did from its own metrics registry, and prints a row per second and a summary.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol

from ..telemetry.exposition import Registry

Send = Callable[[], Awaitable[bool]]


class DemoPart(Protocol):
    name: str  # "http"
    title: str  # one line: what this part shows

    def session(
        self, admin: str | None = None
    ) -> AbstractAsyncContextManager[tuple[Send, Registry]]:
        """Start upstreams and the sidecar (its admin port, and so its console, on ``admin``: ``host:port``, or
        none); yield (send one request -> ok?, the sidecar's metrics registry)."""
        ...


@dataclass
class Totals:
    requests: int = 0
    ok: int = 0
    latencies: list[float] = field(default_factory=list)


def _sum(registry: Registry, metric: str, **match: str) -> float:
    total = 0.0
    for family in registry.collect():
        for s in family.samples:
            if s.name == metric and all(s.labels.get(k) == v for k, v in match.items()):
                total += s.value
    return total


def _by_label(registry: Registry, metric: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name == metric:
                key = s.labels.get(label, "")
                out[key] = out.get(key, 0.0) + s.value
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


@dataclass
class _Snapshot:
    attempts: float
    failed_attempts: float
    retries: dict[str, float]
    hedges: float
    throttled: float
    deadline: float

    @classmethod
    def take(cls, r: Registry) -> _Snapshot:
        attempts = _by_label(r, "sidecar_attempts_total", "outcome")
        return cls(
            attempts=sum(v for k, v in attempts.items() if k != "cancelled"),
            failed_attempts=sum(v for k, v in attempts.items() if k not in ("success", "cancelled", "fatal")),
            retries=_by_label(r, "sidecar_retries_total", "outcome"),
            hedges=_sum(r, "sidecar_hedges_total"),
            throttled=_sum(r, "sidecar_throttled_total"),
            deadline=_sum(r, "sidecar_deadline_expired_total"),
        )


HEADER = (
    f"{'t':>3} {'req/s':>6} {'ok%':>6} {'attempts':>8} {'retries (by cause)':<34} {'hedges':>6} "
    f"{'thrttl':>6} {'dl-exp':>6} {'p50 ms':>7} {'p99 ms':>7}"
)


async def run_part(
    part: DemoPart, duration: float, rate: float, out: Callable[[str], None] = print, admin: str | None = None
) -> dict:
    """Drive ``part`` for ``duration`` seconds at ``rate`` requests/s; print the table; return the summary.
    ``admin``: where the part's sidecar serves its admin port and console (``host:port``; none without)."""
    rng = random.Random(7)
    out(f"\n== {part.name}: {part.title}")
    async with part.session(admin) as (send, registry):
        out(HEADER)
        total = Totals()
        second = Totals()
        start_snap = prev = _Snapshot.take(registry)
        pending: set[asyncio.Task[None]] = set()

        async def one() -> None:
            t0 = time.perf_counter()
            try:
                ok = await send()
            except Exception:
                ok = False
            dt = time.perf_counter() - t0
            for t in (total, second):
                t.requests += 1
                t.ok += ok
                t.latencies.append(dt)

        async def ticker() -> AsyncIterator[int]:
            for s in range(1, int(duration) + 1):
                await asyncio.sleep(1.0)
                yield s

        async def arrivals() -> None:
            loop = asyncio.get_running_loop()
            end = loop.time() + duration
            nxt = loop.time()
            while True:
                nxt += rng.expovariate(rate)
                if nxt >= end:
                    return
                await asyncio.sleep(max(0.0, nxt - loop.time()))
                task = asyncio.create_task(one())
                pending.add(task)
                task.add_done_callback(pending.discard)

        feeder = asyncio.create_task(arrivals())
        try:
            async for s in ticker():
                snap = _Snapshot.take(registry)
                retries = {k: snap.retries.get(k, 0) - prev.retries.get(k, 0) for k in snap.retries}
                retry_txt = " ".join(f"{k}:{int(v)}" for k, v in sorted(retries.items()) if v) or "-"
                ok_pct = 100.0 * second.ok / second.requests if second.requests else float("nan")
                out(
                    f"{s:>3} {second.requests:>6} {ok_pct:>6.1f} {int(snap.attempts - prev.attempts):>8} "
                    f"{retry_txt:<34.34} {int(snap.hedges - prev.hedges):>6} {int(snap.throttled - prev.throttled):>6} "
                    f"{int(snap.deadline - prev.deadline):>6} {_pct(second.latencies, 0.5) * 1000:>7.1f} "
                    f"{_pct(second.latencies, 0.99) * 1000:>7.1f}"
                )
                prev = snap
                second = Totals()
            await feeder
            if pending:
                await asyncio.wait(pending, timeout=15)
        finally:
            feeder.cancel()
            for t in pending:
                t.cancel()
        end = _Snapshot.take(registry)
    attempts = end.attempts - start_snap.attempts
    failed = end.failed_attempts - start_snap.failed_attempts
    summary = {
        "part": part.name,
        "requests": total.requests,
        "ok": total.ok,
        "upstream_attempts": int(attempts),
        "upstream_failures": int(failed),
        "retries": int(sum(end.retries.values()) - sum(start_snap.retries.values())),
        "hedges": int(end.hedges - start_snap.hedges),
        "throttled": int(end.throttled - start_snap.throttled),
        "deadline_expired": int(end.deadline - start_snap.deadline),
        "p50_ms": _pct(total.latencies, 0.5) * 1000,
        "p99_ms": _pct(total.latencies, 0.99) * 1000,
    }
    failed_rate = failed / attempts if attempts else 0.0
    app_err = total.requests - total.ok
    out(
        f"-- {part.name}: {total.requests} requests, {total.ok} ok ({100.0 * total.ok / max(1, total.requests):.2f}%). "
        f"The upstreams failed {int(failed)} of {int(attempts)} attempts ({100 * failed_rate:.1f}%): without the sidecar "
        f"the app would have seen about {int(failed_rate * total.requests)} errors; it saw {app_err}. "
        f"Retries {summary['retries']}, hedges {summary['hedges']}, throttled {summary['throttled']}, "
        f"deadline-expired {summary['deadline_expired']}; amplification {attempts / max(1, total.requests):.2f} "
        f"attempts per request."
    )
    return summary
