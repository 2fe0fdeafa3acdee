"""Prometheus metrics, kept as plain numbers and exported at scrape time.

The sidecar serves every request on one event loop thread, so the hot path needs no locks: an increment is a
Python integer add on a small per-(listener, upstream) object (``Meters``), about 20x cheaper than a
prometheus_client ``Counter.inc()``. A collector registered in the sidecar's registry turns the numbers into
metric families when ``/metrics`` is scraped (``exposition.py``: the families and their text).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any, Final

from .exposition import CounterFamily, Family, GaugeFamily, HistogramFamily, Registry

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, v: float) -> None:
        i = 0  # bisect.bisect_left by hand: compiled, a short loop beats a call into the module
        for bound in self.bounds:
            if v <= bound:
                break
            i += 1
        self.counts[i] += 1
        self.sum += v

    def cumulative(self) -> list[tuple[str, float]]:
        out, acc = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(acc)))
        return out


class ListenerMeters:
    """What is counted per listener, whatever the upstream."""

    __slots__ = ("inflight", "deadline_received", "rejected")

    def __init__(self) -> None:
        self.inflight = 0
        self.deadline_received = 0
        self.rejected: dict[str, int] = {}

    def reject(self, reason: str) -> None:
        """A request refused before any attempt (malformed, no route, not allowed), by reason."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


class Meters:
    """The numbers of one (listener, upstream) pair. Attributes are incremented directly."""

    __slots__ = (
        "listener",
        "attempts",
        "retries",
        "requests",
        "give_ups",
        "hedges",
        "throttled",
        "deadline_expired",
        "cancelled_by_deadline",
        "buffer_exceeded",
        "duration",
    )

    def __init__(self, listener: ListenerMeters) -> None:
        self.listener = listener
        self.attempts: dict[str, int] = {}
        self.retries: dict[str, int] = {}
        self.requests: dict[str, int] = {}
        self.give_ups: dict[str, int] = {}
        self.hedges = 0
        self.throttled = 0
        self.deadline_expired = 0
        self.cancelled_by_deadline = 0
        self.buffer_exceeded = 0
        self.duration = Histogram()

    def attempt(self, outcome: str) -> None:
        self.attempts[outcome] = self.attempts.get(outcome, 0) + 1

    def retry(self, outcome: str) -> None:
        self.retries[outcome] = self.retries.get(outcome, 0) + 1

    def request(self, reason: str) -> None:
        self.requests[reason] = self.requests.get(reason, 0) + 1

    def give_up(self, reason: str) -> None:
        self.give_ups[reason] = self.give_ups.get(reason, 0) + 1


class HttpUpstreamMeters:
    """An HTTP upstream's connections (for every listener that reaches it): TLS handshakes, by endpoint and
    result (``ok``, ``resumed``, ``failed``)."""

    __slots__ = ("tls_handshakes",)

    def __init__(self) -> None:
        self.tls_handshakes: dict[tuple[str, str], int] = {}

    def tls_handshake(self, endpoint: str, result: str) -> None:
        key = (endpoint, result)
        self.tls_handshakes[key] = self.tls_handshakes.get(key, 0) + 1


class HttpListenerMeters:
    """An HTTP listener's tunnels (upgraded connections: WebSocket): open now, and ended, by upstream and by
    who ended them (``client``, ``upstream``, ``idle``, ``drain``)."""

    __slots__ = ("tunnels", "tunnels_ended")

    def __init__(self) -> None:
        self.tunnels = 0
        self.tunnels_ended: dict[tuple[str, str], int] = {}

    def tunnel_opened(self) -> None:
        self.tunnels += 1

    def tunnel_ended(self, upstream: str, end: str) -> None:
        self.tunnels -= 1
        key = (upstream, end)
        self.tunnels_ended[key] = self.tunnels_ended.get(key, 0) + 1


class DnsMeters:
    """An upstream's resolutions, by the name resolved and their result (ok, empty, error); kept for the
    process's life (a counter never goes back), whatever reloads do to the upstream."""

    __slots__ = ("resolutions",)

    def __init__(self) -> None:
        self.resolutions: dict[tuple[str, str], int] = {}

    def count(self, name: str, result: str) -> None:
        key = (name, result)
        self.resolutions[key] = self.resolutions.get(key, 0) + 1


_LABELED: Final = (
    ("requests", "sidecar_requests", "Requests finished, by final decision reason", "reason"),
    ("give_ups", "sidecar_give_ups", "Requests the sidecar gave up on, by reason", "reason"),
    ("attempts", "sidecar_attempts", "Upstream attempts, by outcome class (or cancelled)", "outcome"),
    ("retries", "sidecar_retries", "Retries decided, by the outcome class that caused them", "outcome"),
)
_PLAIN: Final = (
    ("hedges", "sidecar_hedges", "Hedged attempts sent"),
    ("throttled", "sidecar_throttled", "Requests whose retry the retry budget refused"),
    ("deadline_expired", "sidecar_deadline_expired", "Requests that ended because their deadline expired"),
    ("cancelled_by_deadline", "sidecar_cancelled_by_deadline", "Upstream attempts cancelled by the deadline"),
    ("buffer_exceeded", "sidecar_buffer_exceeded", "Requests whose body outgrew the replay buffer"),
)


#: The labels of every ``sidecar_admission_*`` family, whichever limiter a row is of: a listener's request
#: or connection rate (``listener``), an endpoint's ticket pool (``upstream``, ``endpoint``, ``pool``); the
#: labels a limiter does not have are empty (in PromQL, absent). ``shadow``: "true" for a profile that only
#: counts.
ADMISSION_LABELS: Final = ("limiter", "listener", "upstream", "endpoint", "pool", "shadow")
_ADMISSION_COUNTS: Final = (
    ("attempted", "Admissions asked for (exemptions excluded)"),
    ("successful", "Admissions granted, at once or after queueing"),
    ("exempted", "Requests, connections or attempts never limited (exempt address or operation)"),
    ("added_to_queue", "Admissions that waited in a queue"),
    ("removed_from_queue", "Waits that ended, admitted or not"),
    ("interrupted_in_queue", "Waits that ended because the client went away"),
)
#: One row of the admission families: label values (in ``ADMISSION_LABELS`` order), the limiter's
#: ``admission.AdmissionStats``, the tokens (or tickets) available now, its queue-time histogram.
AdmissionRow = tuple[list[str], Any, float, Histogram]


class Metrics:
    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry if registry is not None else Registry()
        self._meters: dict[tuple[str, str], Meters] = {}
        self._listeners: dict[str, ListenerMeters] = {}
        self._buckets: dict[tuple[str, str], Any] = {}
        self._outliers: dict[str, Any] = {}
        self._budgets: dict[tuple[str, str], Any] = {}
        self._fleet: Any = None
        self._concurrency: dict[str, Any] = {}
        self._doors: dict[str, Any] = {}
        self._dns: dict[str, DnsMeters] = {}
        self._endpoints: dict[str, Any] = {}
        self._http_upstreams: dict[str, HttpUpstreamMeters] = {}
        self._http_listeners: dict[str, HttpListenerMeters] = {}
        self.reloads: dict[str, int] = {}
        self.registry.register(_Collector(self))

    def reloaded(self, result: str) -> None:
        """A configuration reload ended: ``applied``, ``unchanged`` or ``rejected``."""
        self.reloads[result] = self.reloads.get(result, 0) + 1

    def listener(self, name: str) -> ListenerMeters:
        m = self._listeners.get(name)
        if m is None:
            m = self._listeners[name] = ListenerMeters()
        return m

    def meters(self, listener: str, upstream: str) -> Meters:
        key = (listener, upstream)
        m = self._meters.get(key)
        if m is None:
            m = self._meters[key] = Meters(self.listener(listener))
        return m

    def watch_throttle(self, upstream: str, kind: str, bucket: Any) -> None:
        """Export ``bucket.tokens`` as ``sidecar_throttle_tokens{upstream,kind}`` (read at scrape time)."""
        self._buckets[(upstream, kind)] = bucket

    def watch_outliers(self, upstream: str, balancer: Any) -> None:
        """Export the ejections of ``balancer.outliers`` (read at scrape time):
        ``sidecar_endpoint_ejected{upstream,endpoint}`` (1 while out of the rotation) for each of
        ``balancer.endpoints``, and ``sidecar_ejections_total{upstream,reason}``."""
        self._outliers[upstream] = balancer

    def http_upstream(self, upstream: str) -> HttpUpstreamMeters:
        """An HTTP upstream's connection counters (``sidecar_upstream_tls_handshakes_total``)."""
        m = self._http_upstreams.get(upstream)
        if m is None:
            m = self._http_upstreams[upstream] = HttpUpstreamMeters()
        return m

    def http_listener(self, listener: str) -> HttpListenerMeters:
        """An HTTP listener's tunnels (``sidecar_http_tunnels``, ``sidecar_http_tunnels_total``)."""
        m = self._http_listeners.get(listener)
        if m is None:
            m = self._http_listeners[listener] = HttpListenerMeters()
        return m

    def dns(self, upstream: str) -> DnsMeters:
        """The resolution counters of ``upstream`` (``sidecar_dns_resolutions_total{upstream,name,result}``)."""
        m = self._dns.get(upstream)
        if m is None:
            m = self._dns[upstream] = DnsMeters()
        return m

    def watch_endpoints(self, upstream: str, endpoints: Any) -> None:
        """Export an upstream's set (``upstream.discovery.UpstreamEndpoints``), read at scrape time:
        ``sidecar_upstream_endpoints{upstream,state}`` (active, ejected, draining) and
        ``sidecar_dns_last_success_timestamp_seconds{upstream,name}`` for each name it resolves."""
        self._endpoints[upstream] = endpoints

    def forget_upstream(self, upstream: str) -> None:
        """A reload removed ``upstream``: its set and its ejections are no longer exported (its counters, which
        never go back, stay)."""
        self._endpoints.pop(upstream, None)
        self._outliers.pop(upstream, None)

    def watch_retry_budget(self, upstream: str, scope: str, budget: Any) -> None:
        """Export an upstream's ``retry_budget`` (``policy.RetryBudget``): its tokens and the retries it
        refused, labelled with its ``scope`` (read at scrape time)."""
        self._budgets[(upstream, scope)] = budget

    def watch_concurrency(self, upstream: str, concurrency: Any) -> None:
        """Export an upstream's execution control (``concurrency.UpstreamConcurrency``; ``None``: it has none
        any more), read at scrape time: per endpoint and pool its limit, tickets in use, queue and admission
        counters, and its prober's state."""
        if concurrency is None:
            self._concurrency.pop(upstream, None)
        else:
            self._concurrency[upstream] = concurrency

    def watch_door(self, listener: str, door: Any) -> None:
        """Export a listener's admission (``sidecar.door.Door``: its request and connection buckets), read at
        scrape time as rows of the ``sidecar_admission_*`` families."""
        self._doors[listener] = door

    def watch_fleet(self, member: Any) -> None:
        """Export a fleet member (``fleet.FleetMember``): Redis up, members seen, settle latency, shares."""
        self._fleet = member

    # -- reading (the console's tables and charts read what /metrics exports) ---------------------------
    def pairs(self) -> list[tuple[tuple[str, str], Meters]]:
        """Every (listener, upstream) pair's numbers, sorted."""
        return sorted(self._meters.items())

    def listeners(self) -> dict[str, ListenerMeters]:
        return dict(self._listeners)

    def throttles(self) -> dict[tuple[str, str], Any]:
        """Each upstream's retry budget buckets by (upstream, kind): their ``tokens`` and ``capacity``."""
        return dict(self._buckets)

    def families(self) -> Iterator[Family]:
        lu = ["listener", "upstream"]
        pairs = sorted(self._meters.items())
        for attr, name, doc, label in _LABELED:
            fam = CounterFamily(name, doc, labels=[*lu, label])
            for (lst, up), m in pairs:
                for value, n in sorted(getattr(m, attr).items()):
                    fam.add_metric([lst, up, value], n)
            yield fam
        for attr, name, doc in _PLAIN:
            fam = CounterFamily(name, doc, labels=lu)
            for (lst, up), m in pairs:
                fam.add_metric([lst, up], getattr(m, attr))
            yield fam
        hist = HistogramFamily(
            "sidecar_request_duration_seconds", "Time from request to response end", labels=lu
        )
        for (lst, up), m in pairs:
            hist.add_metric([lst, up], m.duration.cumulative(), m.duration.sum)
        yield hist
        listeners = sorted(self._listeners.items())
        inflight = GaugeFamily("sidecar_inflight_requests", "Requests in progress", labels=["listener"])
        received = CounterFamily(
            "sidecar_deadline_received", "Requests that arrived with a deadline", labels=["listener"]
        )
        rejected = CounterFamily(
            "sidecar_rejected",
            "Requests refused before any attempt (bad input, no route), by reason",
            labels=["listener", "reason"],
        )
        for name, lm in listeners:
            inflight.add_metric([name], lm.inflight)
            received.add_metric([name], lm.deadline_received)
            for reason, n in sorted(lm.rejected.items()):
                rejected.add_metric([name, reason], n)
        yield inflight
        yield received
        yield rejected
        tokens = GaugeFamily(
            "sidecar_throttle_tokens", "Tokens in each upstream's retry budget", labels=["upstream", "kind"]
        )
        for (upstream, kind), bucket in sorted(self._buckets.items()):
            tokens.add_metric([upstream, kind], float(bucket.tokens))
        yield tokens
        yield from self._outlier_families()
        yield from self._endpoint_families()
        yield from self._http_families()
        if self._budgets:
            yield from self._budget_families()
        if self._fleet is not None:
            yield from self._fleet_families(self._fleet)
        if self._concurrency:
            yield from self._concurrency_families()
        rows = [*self._door_rows(), *self._ticket_rows()]
        if rows:
            yield from admission_families(rows)
        reloads = CounterFamily(
            "sidecar_config_reloads",
            "Configuration reloads, by result (applied, unchanged, rejected)",
            labels=["result"],
        )
        for result, n in sorted(self.reloads.items()):
            reloads.add_metric([result], n)
        yield reloads

    def _http_families(self) -> Iterator[Family]:
        if self._http_upstreams:
            tls = CounterFamily(
                "sidecar_upstream_tls_handshakes",
                "TLS handshakes with HTTP upstreams, by endpoint and result (ok, resumed, failed)",
                labels=["upstream", "endpoint", "result"],
            )
            for upstream, m in sorted(self._http_upstreams.items()):
                for (endpoint, result), n in sorted(m.tls_handshakes.items()):
                    tls.add_metric([upstream, endpoint, result], n)
            yield tls
        if self._http_listeners:
            listeners = sorted(self._http_listeners.items())
            open_now = GaugeFamily(
                "sidecar_http_tunnels", "Upgraded connections (WebSocket) open now", labels=["listener"]
            )
            ended = CounterFamily(
                "sidecar_http_tunnels",
                "Upgraded connections ended, by upstream and by who ended them (client, upstream, idle, drain)",
                labels=["listener", "upstream", "end"],
            )
            for listener, lm in listeners:
                open_now.add_metric([listener], lm.tunnels)
                for (upstream, end), n in sorted(lm.tunnels_ended.items()):
                    ended.add_metric([listener, upstream, end], n)
            yield open_now
            yield ended

    def _door_rows(self) -> Iterator[AdmissionRow]:
        now = time.monotonic()  # the event loop's clock (asyncio's and uvloop's are both CLOCK_MONOTONIC)
        for listener, door in sorted(self._doors.items()):
            shadow = "true" if door.shadow else "false"
            for limiter, bucket in (("requests", door.requests), ("connections", door.connections)):
                if bucket is not None:
                    labels = [limiter, listener, "", "", "", shadow]
                    yield labels, bucket.stats, bucket.available(now), door.queue_seconds[limiter]

    def _ticket_rows(self) -> Iterator[AdmissionRow]:
        for upstream, cc in sorted(self._concurrency.items()):
            for endpoint, ep in sorted(cc.endpoints.items()):
                for pool in (ep.control.pools.read, ep.control.pools.write):
                    labels = ["concurrency", "", upstream, endpoint, pool.kind.value, "false"]
                    yield labels, pool.stats, float(pool.available), ep.queue_time[pool.kind]

    def _outlier_families(self) -> Iterator[Family]:
        ejected = GaugeFamily(
            "sidecar_endpoint_ejected",
            "1 while outlier detection keeps the endpoint out of the rotation",
            labels=["upstream", "endpoint"],
        )
        ejections = CounterFamily(
            "sidecar_ejections",
            "Endpoints ejected by outlier detection, by reason",
            labels=["upstream", "reason"],
        )
        for upstream, balancer in sorted(self._outliers.items()):
            detector = balancer.outliers
            if detector is None:  # outlier detection off
                continue
            for endpoint in balancer.endpoints:
                ejected.add_metric([upstream, endpoint], 1.0 if endpoint in detector.ejected else 0.0)
            for reason, n in sorted(detector.ejections.items()):
                ejections.add_metric([upstream, reason], n)
        yield ejected
        yield ejections

    def _endpoint_families(self) -> Iterator[Family]:
        count = GaugeFamily(
            "sidecar_upstream_endpoints",
            "An upstream's endpoints (one per address), by state: active, ejected (outlier detection), draining "
            "(left the set, attempts still in flight)",
            labels=["upstream", "state"],
        )
        resolutions = CounterFamily(
            "sidecar_dns_resolutions",
            "Resolutions of an upstream's names, by result: ok, empty (NXDOMAIN, no address), error (kept "
            "the last good answer)",
            labels=["upstream", "name", "result"],
        )
        success = GaugeFamily(
            "sidecar_dns_last_success_timestamp_seconds",
            "When an upstream's name last resolved (ok or empty), in seconds since the epoch",
            labels=["upstream", "name"],
        )
        for upstream, eps in sorted(self._endpoints.items()):
            balancer = eps.balancer
            detector = balancer.outliers
            ejected = 0
            if detector is not None:
                ejected = sum(1 for e in balancer.endpoints if e in detector.ejected)
            count.add_metric([upstream, "active"], float(len(balancer.endpoints) - ejected))
            count.add_metric([upstream, "ejected"], float(ejected))
            count.add_metric([upstream, "draining"], float(len(balancer.draining)))
            for name, when in eps.last_success():
                success.add_metric([upstream, name], when)
        for upstream, dns in sorted(self._dns.items()):
            for (name, result), n in sorted(dns.resolutions.items()):
                resolutions.add_metric([upstream, name, result], n)
        yield count
        yield resolutions
        yield success

    def _budget_families(self) -> Iterator[Family]:
        labels = ["upstream", "scope"]
        tokens = GaugeFamily(
            "sidecar_retry_budget_tokens", "Retries the upstream's retry_budget allows now", labels=labels
        )
        refused = CounterFamily(
            "sidecar_retry_budget_throttled",
            "Retries and hedges the upstream's retry_budget refused",
            labels=labels,
        )
        for (upstream, scope), budget in sorted(self._budgets.items()):
            tokens.add_metric([upstream, scope], float(budget.tokens))
            refused.add_metric([upstream, scope], budget.refused)
        yield tokens
        yield refused

    def _concurrency_families(self) -> Iterator[Family]:
        """Each endpoint's ticket pools (the admission counters of the pools are rows of
        ``admission_families``, ``limiter="concurrency"``)."""
        labels = ["upstream", "endpoint", "pool"]
        limit = GaugeFamily(
            "sidecar_concurrency_limit",
            "Tickets of an endpoint's pool (attempts it may have in flight)",
            labels=labels,
        )
        in_use = GaugeFamily(
            "sidecar_concurrency_in_use",
            "Tickets of an endpoint's pool held: by attempts in flight (abandoned=false), or by attempts given "
            "up on whose request the upstream may still hold (abandoned=true)",
            labels=[*labels, "abandoned"],
        )
        queued = GaugeFamily(
            "sidecar_concurrency_queued", "Attempts waiting for a ticket of an endpoint's pool", labels=labels
        )
        state = GaugeFamily(
            "sidecar_concurrency_probe_state",
            "An endpoint's throughput prober: 0 stable, 1 probing up, 2 probing down",
            labels=["upstream", "endpoint"],
        )
        for upstream, cc in sorted(self._concurrency.items()):
            for endpoint, ep in sorted(cc.endpoints.items()):
                state.add_metric([upstream, endpoint], float(int(ep.control.probe_state)))
                for pool in (ep.control.pools.read, ep.control.pools.write):
                    values = [upstream, endpoint, pool.kind.value]
                    limit.add_metric(values, float(pool.limit))
                    in_use.add_metric([*values, "false"], float(pool.in_use - pool.abandoned))
                    in_use.add_metric([*values, "true"], float(pool.abandoned))
                    queued.add_metric(values, float(pool.queued))
        yield limit
        yield in_use
        yield queued
        yield state

    def _fleet_families(self, member: Any) -> Iterator[Family]:
        yield GaugeFamily(
            "sidecar_fleet_redis_up", "1 while settles with Redis succeed", value=member.up
        )
        yield GaugeFamily(
            "sidecar_fleet_members",
            "Sidecars seen alive at the last settle (or assumed)",
            value=member.members,
        )
        lease = HistogramFamily("sidecar_fleet_lease_seconds", "Time one settle with Redis took")
        h = member.latency
        lease.add_metric([], h.cumulative(), h.sum)
        yield lease
        share = GaugeFamily(
            "sidecar_fleet_share",
            "This sidecar's share of each fleet-wide budget (0..1): an upstream's retry budget, or a listener's "
            "request rate (limiter requests)",
            labels=["upstream", "listener", "limiter"],
        )
        for (upstream, listener), value in sorted(member.share_by_labels().items()):
            share.add_metric([upstream, listener, "requests" if listener else "retry_budget"], value)
        yield share


def admission_families(rows: Iterable[AdmissionRow]) -> Iterator[Family]:
    """The seed's admission counters (``serverStatus`` ``attemptedAdmissions``, ...), one family each, with a
    row per limiter: ``sidecar_admission_{attempted,successful,rejected,exempted,added_to_queue,
    removed_from_queue,interrupted_in_queue}_total``, ``sidecar_admission_available_tokens``,
    ``sidecar_admission_queue_seconds``."""
    labels = list(ADMISSION_LABELS)
    counters = {
        count: CounterFamily(f"sidecar_admission_{count}", doc, labels=labels)
        for count, doc in _ADMISSION_COUNTS
    }
    rejected = CounterFamily(
        "sidecar_admission_rejected", "Admissions refused, by reason", labels=[*labels, "reason"]
    )
    available = GaugeFamily(
        "sidecar_admission_available_tokens",
        "Tokens (or tickets) a new admission could take now",
        labels=labels,
    )
    waited = HistogramFamily(
        "sidecar_admission_queue_seconds", "Time queued before admission", labels=labels
    )
    for values, stats, free, hist in rows:
        for count, fam in counters.items():
            fam.add_metric(values, getattr(stats, count))
        for reason, n in sorted(stats.rejected_by.items()):
            rejected.add_metric([*values, str(reason)], n)
        available.add_metric(values, float(free))
        waited.add_metric(values, hist.cumulative(), hist.sum)
    yield from counters.values()
    yield rejected
    yield available
    yield waited


class _Collector:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Family]:
        return self._metrics.families()
