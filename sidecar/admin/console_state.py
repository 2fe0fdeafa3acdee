"""What the console's ``/api/state`` says: the sidecar now, read from the objects that hold it.

Per listener: its address, requests in flight, its door (tokens, refusals by reason). Per (listener,
upstream) pair: the last second's rates (``console_series.Sampler``) and the totals since start (the same
numbers ``/metrics`` exports). Per upstream: its retry budgets, fleet share, ejections, and each endpoint's
state (:func:`endpoint_states`), load, ticket pools and recent outcome classes. The config's generation and
last reload. Nothing here changes what it reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..telemetry.tap import OUTCOMES

if TYPE_CHECKING:
    from ..services import UpstreamRuntime
    from ..upstream.balancer import Balancer

#: An endpoint's state, worst first: what the console shows (and sorts by).
DRAINING = "draining"  # its endpoint set dropped it: no new attempts; those in flight finish
EJECTED = "ejected"  # outlier detection took it out of the rotation (it kept failing)
PROBING = "probing"  # ejected, its time up: one request is probing it
COOLDOWN = "cooldown"  # it answered "overloaded": avoided by every request for overload_cooldown
ACTIVE = "active"
STATES = (DRAINING, EJECTED, PROBING, COOLDOWN, ACTIVE)
_PROBE_STATES = ("stable", "up", "down")


@dataclass(frozen=True, slots=True)
class EndpointState:
    """One endpoint as the balancer sees it: ``state`` (one of :data:`STATES`), ``left``: seconds until that
    state ends (cooldown, ejection; ``None`` when it has no end), ``outstanding``: attempts in flight."""

    endpoint: str
    state: str
    left: float | None
    outstanding: int


def endpoint_states(upstream: UpstreamRuntime, now: float) -> list[EndpointState]:
    """The one place an endpoint's state is read (the page, ``sidecar top`` and the JSON say the same).

    ``now``: the loop's clock. The endpoints are the balancer's set, those draining out of it (a name now
    resolves elsewhere, a reload dropped them: attempts still outstanding), and those attempts went to (a
    MongoDB replica set's members are found by monitoring). The balancer says active, ejected or draining
    (``Balancer.state``, as ``/config`` does); this adds the cooldown after an overload and the probe of an
    ejected endpoint, with the time left."""
    balancer: Balancer = upstream.balancer
    names: dict[str, None] = dict.fromkeys(balancer.endpoints)
    names.update(balancer.draining)
    names.update(dict.fromkeys(balancer.outstanding))
    ejected = balancer.outliers.ejected if balancer.outliers is not None else {}
    out = []
    for e in names:
        left: float | None = None
        base = balancer.state(e)
        health = ejected.get(e)
        if base == DRAINING:
            state = DRAINING
        elif health is not None:
            state = PROBING if health.probing else EJECTED
            left = max(0.0, health.until - now) if not health.probing else None
        elif balancer.cooldown_until(e) > now:
            state, left = COOLDOWN, balancer.cooldown_until(e) - now
        else:
            state = ACTIVE
        out.append(EndpointState(e, state, left, balancer.outstanding.get(e, 0)))
    return out


def finite(x: float | None) -> float | None:
    """JSON has no NaN or infinity: ``None`` for them (and for ``None``), else ``x`` rounded for reading."""
    if x is None or isinstance(x, int):
        return x
    return round(x, 4) if math.isfinite(x) else None


def _figures(last: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if last is None:
        return None
    out: dict[str, Any] = {}
    for k, v in last.items():
        out[k] = {c: finite(n) for c, n in v.items()} if isinstance(v, dict) else finite(v)
    return out


def totals(m: Any) -> dict[str, Any]:
    """A pair's counts since start, as ``/metrics`` has them (``sidecar_requests_total`` by reason, ...)."""
    return {
        "requests": dict(sorted(m.requests.items())),
        "attempts": dict(sorted(m.attempts.items())),
        "retries": dict(sorted(m.retries.items())),
        "give_ups": dict(sorted(m.give_ups.items())),
        "hedges": m.hedges,
        "throttled": m.throttled,
        "deadline_expired": m.deadline_expired,
        "cancelled_by_deadline": m.cancelled_by_deadline,
        "buffer_exceeded": m.buffer_exceeded,
    }


def door(d: Any, now: float) -> dict[str, Any]:
    out: dict[str, Any] = {"profile": d.profile, "shadow": d.shadow, "fleet": d.fleet}
    for limiter in ("requests", "connections"):
        bucket = getattr(d, limiter)
        if bucket is None:
            out[limiter] = None
            continue
        stats = bucket.stats
        out[limiter] = {
            "rate": bucket.rate,
            "burst": bucket.burst,
            "available": finite(float(bucket.available(now))),
            "attempted": stats.attempted,
            "successful": stats.successful,
            "exempted": stats.exempted,
            "queued": stats.added_to_queue - stats.removed_from_queue,
            "rejected": {str(r): n for r, n in sorted(stats.rejected_by.items()) if n},
        }
    return out


def refused_so_far(d: Any) -> int:
    """Requests and connections a listener's door refused, ever (the sampler's refusals per second)."""
    return sum(b.stats.rejected for b in (d.requests, d.connections) if b is not None)


def pools(upstream: UpstreamRuntime) -> Iterator[tuple[str, str, int, int]]:
    """(upstream, endpoint, limit, tickets in use) of each endpoint with ticket pools: the sampler's lines."""
    cc = upstream.concurrency
    if cc is None:
        return
    for endpoint, ep in cc.endpoints.items():
        p = ep.control.pools
        yield upstream.name, endpoint, p.limit, p.in_use


def upstream_view(
    up: UpstreamRuntime,
    now: float,
    throttles: Mapping[tuple[str, str], Any],
    shares: Mapping[tuple[str, str], float],
    recent: Mapping[str, list[int]] | None,
    text: Callable[[str], str] = str,
) -> dict[str, Any]:
    """One upstream: its budgets, its ejections and every endpoint (with the name it was found under, when
    a name: ``text`` hides the config's secrets in it). ``recent``: outcome counts per endpoint (``None``: the
    tap is not armed, so none were counted)."""
    cc = up.concurrency
    endpoints = []
    for st in endpoint_states(up, now):
        name = up.endpoints.name_of(st.endpoint)
        row: dict[str, Any] = {
            "endpoint": st.endpoint,
            "name": text(name) if name != st.endpoint else None,
            "state": st.state,
            "left_s": finite(st.left) if st.left is not None else None,
            "outstanding": st.outstanding,
            "concurrency": None,
            "outcomes": None,
        }
        ep = cc.endpoints.get(st.endpoint) if cc is not None else None
        if ep is not None:
            pools_ = ep.control.pools
            row["concurrency"] = {
                "limit": pools_.limit,
                "in_use": pools_.in_use,
                "queued": pools_.read.queued + pools_.write.queued,
                "probe": _PROBE_STATES[int(ep.control.probe_state)],
                "rejected": pools_.read.stats.rejected + pools_.write.stats.rejected,
            }
        if recent is not None:
            counts = recent.get(st.endpoint)
            row["outcomes"] = {c: n for c, n in zip(OUTCOMES, counts, strict=True) if n} if counts else {}
        endpoints.append(row)
    budget = up.retry_budget
    outliers = up.balancer.outliers
    return {
        "name": up.name,
        "endpoints": endpoints,
        "throttles": [
            {"kind": kind, "tokens": finite(float(b.tokens)), "capacity": finite(float(b.capacity))}
            for (name, kind), b in sorted(throttles.items())
            if name == up.name
        ],
        "retry_budget": None
        if budget is None or up.config.retry_budget is None
        else {
            "scope": up.config.retry_budget.scope,
            "tokens": finite(float(budget.tokens)),
            "refused": budget.refused,
        },
        "fleet_share": finite(shares[(up.name, "")]) if (up.name, "") in shares else None,
        "ejections": dict(sorted(outliers.ejections.items())) if outliers is not None else None,
        "concurrency": None
        if cc is None
        else {
            "mode": cc.config.mode,
            "min": cc.config.min,
            "max": cc.config.max,
            "initial": cc.config.initial,
        },
    }


def traffic_view(
    pairs: list[tuple[tuple[str, str], Any]], last: Callable[[tuple[str, str]], Mapping[str, Any] | None]
) -> list[dict[str, Any]]:
    return [
        {"listener": lst, "upstream": up, "last": _figures(last((lst, up))), "totals": totals(m)}
        for (lst, up), m in pairs
    ]
