"""What a run measured, second by second: the same record for both engines.

Times are seconds since the run started (virtual for des, from a shared monotonic epoch for live). Each
count lands in the second its event happened in:

* ``offered``  client requests started (what the application asked for);
* ``ok``       client requests that got a successful answer (goodput);
* ``failed``   client requests given up (the sidecar's failure answer, or a client's patience ran out);
* ``errors``   client attempts answered with an error (5xx, refused, reset);
* ``timeouts`` client attempts that ran into the client's timeout (or the sidecar's deadline answer);
* ``attempts`` attempts sent to the upstream server (the clients' own, or the sidecar's);
* ``inflight`` requests in the server (summed over replicas), the highest seen in the second;
* ``latencies`` milliseconds from start to end of each client request that ended in the second.

The live engine's processes each keep a part of it (clients, sidecar, server); :meth:`Record.merge` adds
them up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

COUNTS = ("offered", "ok", "failed", "errors", "timeouts", "attempts")


@dataclass(slots=True)
class Second:
    offered: int = 0
    ok: int = 0
    failed: int = 0
    errors: int = 0
    timeouts: int = 0
    attempts: int = 0
    inflight: int = -1  # -1: no sample this second (a stopped server reports nothing)
    latencies: list[float] = field(default_factory=list)


class Record:
    __slots__ = ("seconds", "unfinished", "unfinished_old")

    def __init__(self, duration: float) -> None:
        self.seconds = [Second() for _ in range(max(1, math.ceil(duration)))]
        self.unfinished = 0  # client requests still open when the run ended
        self.unfinished_old = 0  # ... of which started more than a client timeout before the end

    def at(self, t: float) -> Second:
        i = int(t)
        n = len(self.seconds)
        return self.seconds[0 if i < 0 else (i if i < n else n - 1)]

    # -- events ---------------------------------------------------------------------------------------
    def started(self, t: float) -> None:
        self.at(t).offered += 1

    def ended(self, t: float, started: float, ok: bool) -> None:
        s = self.at(t)
        if ok:
            s.ok += 1
        else:
            s.failed += 1
        s.latencies.append((t - started) * 1000.0)

    def error(self, t: float) -> None:
        self.at(t).errors += 1

    def timeout(self, t: float) -> None:
        self.at(t).timeouts += 1

    def attempt(self, t: float) -> None:
        self.at(t).attempts += 1

    def inflight(self, t: float, n: int) -> None:
        s = self.at(t)
        if n > s.inflight:
            s.inflight = n

    def open_at_end(self, starts: list[float], end: float, timeout: float) -> None:
        self.unfinished += len(starts)
        self.unfinished_old += sum(1 for s in starts if s < end - timeout)

    # -- after the run --------------------------------------------------------------------------------
    def fill_inflight(self) -> None:
        """Seconds without a sample keep the last one (the server was stopped: nothing changed in it)."""
        last = 0
        for s in self.seconds:
            if s.inflight < 0:
                s.inflight = last
            last = s.inflight

    @classmethod
    def merge(cls, parts: list[Record], inflight_parts: list[Record] | None = None) -> Record:
        """Counts and latencies add up; in-flight samples of ``inflight_parts`` (one per server) are summed
        after each is filled forward."""
        out = cls(len(parts[0].seconds))
        for p in parts:
            out.unfinished += p.unfinished
            out.unfinished_old += p.unfinished_old
            for mine, theirs in zip(out.seconds, p.seconds, strict=False):
                for name in COUNTS:
                    setattr(mine, name, getattr(mine, name) + getattr(theirs, name))
                mine.latencies.extend(theirs.latencies)
        for p in inflight_parts or []:
            p.fill_inflight()
            for mine, theirs in zip(out.seconds, p.seconds, strict=False):
                mine.inflight = max(mine.inflight, 0) + theirs.inflight
        out.fill_inflight()
        return out

    def to_json(self) -> dict[str, Any]:
        cols: dict[str, Any] = {name: [getattr(s, name) for s in self.seconds] for name in COUNTS}
        cols["inflight"] = [s.inflight for s in self.seconds]
        cols["latencies"] = [[round(x, 3) for x in s.latencies] for s in self.seconds]
        cols["unfinished"] = self.unfinished
        cols["unfinished_old"] = self.unfinished_old
        return cols

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        n = len(data["offered"])
        rec = cls(n)
        for i, s in enumerate(rec.seconds):
            for name in COUNTS:
                setattr(s, name, data[name][i])
            s.inflight = data["inflight"][i]
            s.latencies = list(data["latencies"][i])
        rec.unfinished = data.get("unfinished", 0)
        rec.unfinished_old = data.get("unfinished_old", 0)
        return rec


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..1); ``None`` for no values."""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]
