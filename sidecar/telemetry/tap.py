"""The tap: the last requests the sidecar handled, each with its attempts, their endpoints and outcomes, the
decision after each and why, the waits and the total time, in a bounded ring that the console reads
(``/api/tap``, ``sidecar tap``).

Armed only while someone reads it: the console sets ``Telemetry.tap`` when a reader asks and clears it when
nobody asked for a while. Unarmed, a request pays one test of ``RequestObserver.tap`` per observer hook;
armed, its observer fills a :class:`TapRecord` that :meth:`Tap.push` puts in the ring when the request ends.
Armed, each attempt's outcome is also counted per endpoint (:meth:`Tap.outcomes_taken`): the console's
"recent outcome classes" of an endpoint.

What a record holds is what the sidecar itself decided or acted on: the route (an HTTP path without its
query string, a gRPC method, a MongoDB command and collection), the endpoint, the outcome class and its
short label (``503``, ``UNAVAILABLE``, ``code 462``), a server's pushback delay, the deadline the client
sent (as a number), the status answered. Never a body, never a header value, never a query string.

Memory: :data:`CAPACITY` records at most (about 0.5 KiB each with two attempts: docs/console.md).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from ..policy import CancelAttempt, Decision, Finish, Outcome, OutcomeClass, SendAttempt

#: Records kept: the last this many requests (of every listener).
CAPACITY: Final = 1024
#: The order of an endpoint's outcome counts (:meth:`Tap.outcomes_taken`): the outcome classes, then attempts
#: cancelled before they had one (a hedge that lost, the deadline, the client gone).
OUTCOMES: Final = (*(c.value for c in OutcomeClass), "cancelled")
#: The classes in that order, found by identity (an enum member's hash and ``.value`` are Python calls; the
#: members are ``str``: the record keeps the member itself and JSON writes its text).
_CLASSES: Final = tuple(OutcomeClass)
_CANCELLED: Final = len(OUTCOMES) - 1
_perf_counter: Final = time.perf_counter
_time: Final = time.time


class TapAttempt:
    """One attempt of a tapped request. Times are milliseconds from the request's start."""

    __slots__ = (
        "n",
        "endpoint",
        "hedge",
        "start",
        "end",
        "outcome",
        "detail",
        "pushback",
        "decision",
        "wait",
        "cancelled",
    )

    def __init__(self, n: int, endpoint: str, hedge: int, start: float) -> None:
        self.n = n
        self.endpoint = endpoint
        self.hedge = hedge
        self.start = start
        self.end = -1.0
        self.outcome = ""
        self.detail = ""
        self.pushback = -1.0  # ms; -1: none; -2: "do not retry"
        self.decision = ""
        self.wait = 0.0  # ms, the wait the decision chose before the next attempt
        self.cancelled = ""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n": self.n, "endpoint": self.endpoint, "start_ms": round(self.start, 3)}
        if self.hedge:
            out["hedge"] = self.hedge
        if self.end >= 0:
            out["ms"] = round(self.end - self.start, 3)
        if self.outcome:
            out["outcome"] = self.outcome
        if self.detail:
            out["detail"] = self.detail
        if self.pushback >= 0:
            out["pushback_ms"] = round(self.pushback, 3)
        elif self.pushback == -2.0:
            out["pushback"] = "stop"
        if self.decision:
            out["decision"] = self.decision
        if self.wait:
            out["wait_ms"] = round(self.wait, 3)
        if self.cancelled:
            out["cancelled"] = self.cancelled
        return out


class TapRecord:
    """One tapped request, filled by its observer (``RequestObserver``) as it goes."""

    __slots__ = (
        "tap",
        "seq",
        "at",
        "started",
        "listener",
        "upstream",
        "protocol",
        "name",
        "path",
        "status",
        "deadline",
        "attempts",
        "reason",
        "error",
        "total",
    )

    def __init__(
        self,
        tap: Tap,
        listener: str,
        upstream: str,
        protocol: str,
        name: str,
        attributes: Mapping[str, Any] | None,
        started: float,
    ) -> None:
        self.tap = tap
        self.seq = 0
        self.at = _time()
        self.started = started
        self.listener = listener
        self.upstream = upstream
        self.protocol = protocol
        self.name = name
        path: Any = attributes.get("url.path") if attributes else None  # HTTP: the path, query cut off
        self.path = path if isinstance(path, str) else ""
        self.status = ""
        self.deadline = -1.0
        self.attempts: list[TapAttempt] = []
        self.reason = ""
        self.error = ""
        self.total = 0.0

    def _ms(self) -> float:
        return (_perf_counter() - self.started) * 1000.0

    def _attempt(self, n: int) -> TapAttempt | None:
        attempts = self.attempts
        for a in attempts:  # a handful at most; numbered in the order sent
            if a.n == n:
                return a
        return None

    # -- what the observer reports ------------------------------------------------------------------
    def attempt_started(self, cmd: SendAttempt) -> None:
        self.attempts.append(TapAttempt(cmd.attempt, cmd.endpoint, cmd.hedge, self._ms()))

    def attempt_ended(self, attempt: int, outcome: Outcome) -> None:
        a = self._attempt(attempt)
        if a is None:
            return
        a.end = self._ms()
        cls = outcome.cls
        a.outcome = cls
        a.detail = outcome.detail
        pb = outcome.pushback
        if pb is not None:
            delay = pb.delay
            a.pushback = -2.0 if delay is None else delay * 1000.0
        index = 0
        for c in _CLASSES:
            if c is cls:
                break
            index += 1
        self.tap.count(self.upstream, a.endpoint, index)

    def attempt_cancelled(self, cmd: CancelAttempt) -> None:
        a = self._attempt(cmd.attempt)
        if a is None:
            return
        a.cancelled = cmd.reason
        if a.end < 0:
            a.end = self._ms()
            self.tap.count(self.upstream, a.endpoint, _CANCELLED)

    def decision(self, d: Decision) -> None:
        a = self._attempt(d.attempt)
        if a is not None:
            a.decision = d.reason
            a.wait = d.delay * 1000.0

    def finished(self, f: Finish) -> None:
        self.reason = f.reason

    def refused(self, reason: str) -> None:
        self.reason = reason

    def deadline_received(self, timeout_s: float) -> None:
        self.deadline = timeout_s * 1000.0

    def status_answered(self, status: str) -> None:
        self.status = status

    def end(self, seconds: float, error: str | None) -> None:
        self.total = seconds * 1000.0
        if error is not None:
            self.error = error
        self.tap.push(self)

    # -- reading --------------------------------------------------------------------------------------
    def route(self) -> str:
        """``GET /orders/42``, ``pkg.Svc/Method``, ``find orders``."""
        return f"{self.name} {self.path}" if self.path else self.name

    def as_dict(self, text: Callable[[str], str]) -> dict[str, Any]:
        """The record as the console's JSON says it; ``text`` hides secrets in free text (the route, the
        outcome labels, the error)."""
        out: dict[str, Any] = {
            "seq": self.seq,
            "at": round(self.at, 3),
            "listener": self.listener,
            "upstream": self.upstream,
            "protocol": self.protocol,
            "route": text(self.route()),
            "reason": self.reason,
            "total_ms": round(self.total, 3),
            "attempts": [],
        }
        for a in self.attempts:
            d = a.as_dict()
            if a.detail:
                d["detail"] = text(a.detail)
            out["attempts"].append(d)
        if self.status:
            out["status"] = self.status
        if self.deadline >= 0:
            out["deadline_ms"] = round(self.deadline, 3)
        if self.error:
            out["error"] = text(self.error)
        return out


class Tap:
    """The ring of the last :data:`CAPACITY` tapped requests, numbered by ``seq`` (1, 2, ...)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self.ring: deque[TapRecord] = deque(maxlen=capacity)
        self.seq = 0
        #: Called once at the next push, then forgotten (a long poll waiting for a record sets it).
        self.on_push: Callable[[], None] | None = None
        self._outcomes: dict[str, dict[str, list[int]]] = {}

    def record(
        self,
        listener: str,
        upstream: str,
        protocol: str,
        name: str,
        attributes: Mapping[str, Any] | None,
        started: float,
    ) -> TapRecord:
        return TapRecord(self, listener, upstream, protocol, name, attributes, started)

    def push(self, record: TapRecord) -> None:
        self.seq += 1
        record.seq = self.seq
        self.ring.append(record)
        wake = self.on_push
        if wake is not None:
            self.on_push = None
            wake()

    def count(self, upstream: str, endpoint: str, index: int) -> None:
        by_endpoint = self._outcomes.get(upstream)
        if by_endpoint is None:
            by_endpoint = self._outcomes[upstream] = {}
        counts = by_endpoint.get(endpoint)
        if counts is None:
            counts = by_endpoint[endpoint] = [0] * len(OUTCOMES)
        counts[index] += 1

    def outcomes_taken(self) -> dict[str, dict[str, list[int]]]:
        """The outcome counts per upstream and endpoint since the last call (in :data:`OUTCOMES` order)."""
        taken, self._outcomes = self._outcomes, {}
        return taken

    def after(self, seq: int) -> tuple[Iterator[TapRecord], int]:
        """The records numbered above ``seq``, oldest first, and how many such were already pushed out of the
        ring (missed: the reader came too late for them). ``seq < 0``: every record the ring holds."""
        ring = self.ring
        oldest = self.seq - len(ring) + 1
        if seq >= self.seq:
            return iter(()), 0
        missed = max(0, oldest - 1 - seq) if seq >= 0 else 0
        skip = max(0, seq + 1 - oldest)
        return (ring[i] for i in range(skip, len(ring))), missed

    def clear(self) -> None:
        self.ring.clear()
        self._outcomes = {}
