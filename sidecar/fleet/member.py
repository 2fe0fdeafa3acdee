"""One sidecar's side of the fleet's budgets: what a settle reports, what its reply grants, and the fall back
to a local share when Redis cannot be reached. Pure: no sockets, no clock (the driver, ``link.py``, passes
what it measured), so every rule is tested without Redis (``tests/unit/test_fleet_member.py``).

A *share* is one fleet-wide budget as this sidecar sees it: it reports events (what feeds the budget: client
requests for a retry budget), the unused rest of its lease and its demand, and is granted its next lease, or
told to stand alone as one of ``members``. ``RetryBudgetShare`` is the retry budget's; ``RateLimitShare`` a
listener's fleet-wide request rate (admission ``requests.scope: fleet``), over the same script.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..policy import RetryBudget
from ..telemetry.metrics import Histogram

#: Settle latency buckets (seconds): a settle is one round trip, bounded by ``fleet.redis.timeout``.
SETTLE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
#: Demand is smoothed over settles: this much of the last period, the rest from before.
DEMAND_WEIGHT = 0.5


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A fleet-wide budget as Redis keeps it (see ``script.py``)."""

    ratio: float  # tokens each reported event deposits
    rate: float  # floor refill per second
    capacity: float  # floor capacity
    window: float  # seconds over which events count toward the ratio part's cap


@dataclass(frozen=True, slots=True)
class Report:
    events: int
    returned: float
    demand: float


class Share(Protocol):
    name: str  # the pool's key in Redis
    labels: tuple[str, str]  # (upstream, listener) of sidecar_fleet_share: one of them, the other ""
    spec: PoolSpec

    def report(self) -> Report: ...

    def granted(self, tokens: float, share: float) -> None: ...

    def stand_alone(self, members: int) -> None: ...

    @property
    def share(self) -> float: ...


class RetryBudgetShare:
    """An upstream's ``retry_budget`` with ``scope: fleet``: events are its client requests, demand the
    retries asked for; alone, it keeps the ratio over its own requests and ``min_per_second / members``."""

    def __init__(self, name: str, budget: RetryBudget, min_per_second: float) -> None:
        self.name = name
        self.labels = (name, "")
        self.budget = budget
        self.spec = PoolSpec(budget.ratio, min_per_second, min_per_second, budget.window)
        self.min_per_second = min_per_second
        self._requests = budget.requests
        self._wanted = budget.wanted
        self._granted_at_report = budget.granted
        self._demand = 0.0
        self._share = 0.0

    def report(self) -> Report:
        b = self.budget
        events = b.requests - self._requests
        wanted = b.wanted - self._wanted
        self._requests, self._wanted = b.requests, b.wanted
        self._demand = DEMAND_WEIGHT * wanted + (1 - DEMAND_WEIGHT) * self._demand
        # What is left of the lease goes back; what is spent while the settle is out is charged to the next.
        self._granted_at_report = b.granted
        return Report(events, b.lease if b.leased else 0.0, self._demand)

    def granted(self, tokens: float, share: float) -> None:
        spent_meanwhile = self.budget.granted - self._granted_at_report
        self.budget.lease_granted(max(0.0, tokens - spent_meanwhile))
        self._share = share

    def stand_alone(self, members: int) -> None:
        self.budget.stand_alone(self.min_per_second / members)
        self._share = 1.0 / members

    @property
    def share(self) -> float:
        return self._share


class LeasedLimit(Protocol):
    """What a fleet-wide request rate needs of the listener's limiter (``sidecar.door.Door``): how many
    requests asked so far, and its pace."""

    @property
    def attempted(self) -> int: ...

    def pace(self, rate: float, burst: float) -> None: ...


class RateLimitShare:
    """A listener's request rate with ``scope: fleet``. Each settle reports this sidecar's demand (the
    requests that asked since the last one, smoothed) and the script answers its share of the fleet's
    demand among the members alive; the lease for the next period is that share of the fleet's rate:
    the local bucket refills at ``rate x share`` and holds ``burst`` seconds of it (what it holds, and what
    queued requests borrowed, carries over). The shares of the members sum to one, so the fleet admits
    ``rate`` (and banks ``rate x burst``) between them, the busy ones most of it; no Redis round trip is
    on a request's path. Alone (Redis unreachable, or before the first settle), ``rate / members``.

    A share rather than the script's grant of tokens: a grant is a share of what the fleet's bucket holds
    when the member settles, so a member settling just after a busy one finds it nearly empty and gets far
    less than its demand's share (measured: 7 % for 20 % of the demand); a share of the rate does not
    depend on who settled last."""

    def __init__(self, name: str, limit: LeasedLimit, rate: float, burst: float, listener: str = "") -> None:
        self.name = name
        self.labels = ("", listener or name)
        self.limit = limit
        self.rate = rate
        self.burst = burst
        self.spec = PoolSpec(0.0, rate, max(1.0, rate * burst), burst)
        self._attempted = limit.attempted
        self._demand = 0.0
        self._share = 0.0

    def report(self) -> Report:
        attempted = self.limit.attempted
        asked, self._attempted = attempted - self._attempted, attempted
        self._demand = DEMAND_WEIGHT * asked + (1 - DEMAND_WEIGHT) * self._demand
        return Report(0, 0.0, self._demand)

    def granted(self, tokens: float, share: float) -> None:
        self.limit.pace(self.rate * share, self.burst)
        self._share = share

    def stand_alone(self, members: int) -> None:
        self.limit.pace(self.rate / members, self.burst)
        self._share = 1.0 / members

    @property
    def share(self) -> float:
        return self._share


def keys(prefix: str, names: Sequence[str]) -> list[str]:
    """The script's keys: one hash tag (``{prefix}``) so that Redis Cluster keeps them on one slot."""
    tag = "{" + prefix + "}"
    out = [f"{tag}members"]
    for name in names:
        out += [f"{tag}budget:{name}", f"{tag}demand:{name}"]
    return out


class FleetMember:
    """This sidecar in the fleet: its shares, whether Redis answers, how many members it last saw."""

    def __init__(
        self, member_id: str, prefix: str, shares: Sequence[Share], lease: float, fallback_members: int
    ) -> None:
        self.member_id = member_id
        self.shares = list(shares)
        self.lease = lease
        self.ttl = max(5 * lease, 1.0)  # a member not seen for this long is gone
        windows = [s.spec.window for s in self.shares]
        self.expire = max(20 * self.ttl, 2 * max(windows, default=0.0))  # idle keys vanish after this
        self.fallback_members = fallback_members
        self.keys = keys(prefix, [s.name for s in self.shares])
        self.up = 0  # 1 while settles succeed
        self.seen = 0  # members alive at the last successful settle (0: none seen yet)
        self.members = fallback_members
        self.latency = Histogram(SETTLE_BUCKETS)
        self.settles = 0
        self.failures = 0
        for s in self.shares:
            s.stand_alone(fallback_members)

    def request(self) -> list[str | int | float]:
        """The next settle's arguments (``script.SETTLE``'s ARGV); takes the shares' reports."""
        args: list[str | int | float] = [self.member_id, self.ttl, len(self.shares), self.expire]
        for s in self.shares:
            r = s.report()
            p = s.spec
            args += [p.ratio, p.rate, p.capacity, p.window, r.events, r.returned, r.demand]
        return args

    def settled(self, reply: Sequence[object], seconds: float) -> str | None:
        """Apply a settle's reply; the message to log if this ends an outage (or is the first contact)."""
        self.latency.observe(seconds)
        self.settles += 1
        try:
            members = _int(reply[0])
            grants = [(_float(reply[1 + 2 * i]), _float(reply[2 + 2 * i])) for i in range(len(self.shares))]
            if len(reply) != 1 + 2 * len(self.shares) or members < 1:
                raise ValueError("wrong shape")
        except (ValueError, TypeError, IndexError, UnicodeDecodeError):
            return self.failed(f"unexpected reply from Redis: {reply!r:.200}", 0.0)
        for s, (tokens, share) in zip(self.shares, grants, strict=True):
            s.granted(tokens, share)
        was_up = self.up
        self.up = 1
        self.seen = self.members = members
        if was_up:
            return None
        return f"fleet: settled with Redis, {members} member(s) alive; budgets shared"

    def failed(self, error: str, seconds: float) -> str | None:
        """A settle failed or timed out: stand alone as one of the members last seen. The message to log
        once per outage."""
        if seconds > 0:
            self.latency.observe(seconds)
        self.failures += 1
        self.members = self.seen or self.fallback_members
        for s in self.shares:
            s.stand_alone(self.members)
        if self.up == 0 and self.failures > 1:
            return None
        self.up = 0
        return (
            f"fleet: Redis unreachable ({error}); each budget falls back to a local share as 1 of "
            f"{self.members} member(s) until it answers again"
        )

    def share_by_name(self) -> dict[str, float]:
        return {s.name: s.share for s in self.shares}

    def share_by_labels(self) -> dict[tuple[str, str], float]:
        """Each share by its metric labels: (upstream, "") for a retry budget, ("", listener) for a rate."""
        return {s.labels: s.share for s in self.shares}


def _int(v: object) -> int:
    if isinstance(v, bytes):
        v = v.decode()
    return int(v)  # type: ignore[call-overload]


def _float(v: object) -> float:
    if isinstance(v, bytes):
        v = v.decode()
    return float(v)  # type: ignore[arg-type]
