"""Prometheus metrics, in a registry of the sidecar's own (never the process-global one).

Label children are resolved once per (listener, upstream) and cached, so the hot path pays a dict lookup
and an increment, not a label resolution. The in-flight gauge is a plain counter read at scrape time
(two locked gauge updates per request were a measurable part of the HTTP hot path). Label values may be
given as the engine's ``StrEnum`` members (``OutcomeClass``, ``Reason``): they are strings.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        lu = ["listener", "upstream"]
        self.requests = Counter(
            "sidecar_requests", "Requests finished, by final decision reason", [*lu, "reason"], registry=r
        )
        self.give_ups = Counter(
            "sidecar_give_ups", "Requests the sidecar gave up on, by reason", [*lu, "reason"], registry=r
        )
        self.attempts = Counter(
            "sidecar_attempts", "Upstream attempts sent, by outcome class", [*lu, "outcome"], registry=r
        )
        self.retries = Counter(
            "sidecar_retries",
            "Retries decided, by the outcome class that caused them",
            [*lu, "outcome"],
            registry=r,
        )
        self.hedges = Counter("sidecar_hedges", "Hedged attempts sent", lu, registry=r)
        self.throttled = Counter(
            "sidecar_throttled", "Retries or hedges refused by the retry budget", lu, registry=r
        )
        self.deadline_expired = Counter(
            "sidecar_deadline_expired", "Requests that ended because their deadline expired", lu, registry=r
        )
        self.cancelled_by_deadline = Counter(
            "sidecar_cancelled_by_deadline",
            "Upstream attempts cancelled because the deadline expired",
            lu,
            registry=r,
        )
        self.deadline_received = Counter(
            "sidecar_deadline_received", "Requests that arrived with a deadline", ["listener"], registry=r
        )
        self.buffer_exceeded = Counter(
            "sidecar_buffer_exceeded",
            "Requests whose body outgrew the replay buffer (one attempt only)",
            lu,
            registry=r,
        )
        self.inflight = Gauge("sidecar_inflight_requests", "Requests in progress", ["listener"], registry=r)
        self.duration = Histogram(
            "sidecar_request_duration_seconds",
            "Time from request to response end",
            lu,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rejected = Counter(
            "sidecar_rejected",
            "Requests refused before any attempt (bad input, no route), by reason",
            ["listener", "reason"],
            registry=r,
        )
        self._buckets = _ThrottleCollector()
        r.register(self._buckets)
        self._meters: dict[tuple[str, str], Meters] = {}
        self._levels: dict[str, Level] = {}

    def level(self, listener: str) -> Level:
        """The in-flight request count of ``listener`` (one per listener, shared by its upstreams)."""
        lv = self._levels.get(listener)
        if lv is None:
            lv = self._levels[listener] = Level()
            self.inflight.labels(listener).set_function(lambda: lv.n)
        return lv

    def meters(self, listener: str, upstream: str) -> Meters:
        key = (listener, upstream)
        m = self._meters.get(key)
        if m is None:
            m = self._meters[key] = Meters(self, listener, upstream)
        return m

    def watch_throttle(self, upstream: str, kind: str, bucket: Any) -> None:
        """Export ``bucket.tokens`` as ``sidecar_throttle_tokens{upstream,kind}`` (read at scrape time)."""
        self._buckets.buckets[(upstream, kind)] = bucket


class Level:
    """A gauge's value kept as a plain number (read by the registry at scrape time)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def inc(self, amount: int = 1) -> None:
        self.n += amount

    def dec(self, amount: int = 1) -> None:
        self.n -= amount


class Meters:
    """The metric children of one (listener, upstream) pair."""

    __slots__ = (
        "m",
        "labels",
        "hedges",
        "throttled",
        "deadline_expired",
        "cancelled_by_deadline",
        "buffer_exceeded",
        "duration",
        "inflight",
        "deadline_received",
        "_attempts",
        "_retries",
        "_requests",
        "_give_ups",
    )

    def __init__(self, m: Metrics, listener: str, upstream: str) -> None:
        self.m = m
        self.labels = (listener, upstream)
        self.hedges = m.hedges.labels(listener, upstream)
        self.throttled = m.throttled.labels(listener, upstream)
        self.deadline_expired = m.deadline_expired.labels(listener, upstream)
        self.cancelled_by_deadline = m.cancelled_by_deadline.labels(listener, upstream)
        self.buffer_exceeded = m.buffer_exceeded.labels(listener, upstream)
        self.duration = m.duration.labels(listener, upstream)
        self.inflight = m.level(listener)
        self.deadline_received = m.deadline_received.labels(listener)
        self._attempts: dict[str, Any] = {}
        self._retries: dict[str, Any] = {}
        self._requests: dict[str, Any] = {}
        self._give_ups: dict[str, Any] = {}

    def _child(self, cache: dict[str, Any], family: Counter, value: str) -> Any:
        c = cache.get(value)
        if c is None:
            c = cache[value] = family.labels(*self.labels, value)
        return c

    def attempt(self, outcome: str) -> None:
        self._child(self._attempts, self.m.attempts, outcome).inc()

    def retry(self, outcome: str) -> None:
        self._child(self._retries, self.m.retries, outcome).inc()

    def request(self, reason: str) -> None:
        self._child(self._requests, self.m.requests, reason).inc()

    def give_up(self, reason: str) -> None:
        self._child(self._give_ups, self.m.give_ups, reason).inc()


class _ThrottleCollector(Collector):
    def __init__(self) -> None:
        self.buckets: dict[tuple[str, str], Any] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "sidecar_throttle_tokens", "Tokens in each upstream's retry budget", labels=["upstream", "kind"]
        )
        for (upstream, kind), bucket in sorted(self.buckets.items()):
            g.add_metric([upstream, kind], float(bucket.tokens))
        yield g

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("sidecar_throttle_tokens", "Tokens in each upstream's retry budget")
