"""Retry budgets shared by all requests to one upstream: gRPC A6 throttling, MongoDB's token bucket, and
the ratio retry budget (``upstreams.<name>.retry_budget``) consulted on top of either.

A bucket is plain state: it is told about requests and results and asked about retries; it never reads a
clock (the engine passes the ``now`` of the event it handles).
"""

from __future__ import annotations

from math import exp

from .spec import ThrottleKind, ThrottleSpec


class GrpcThrottle:
    """A6: tokens start at max; failure -1, success +ratio (capped); retry/hedge only while tokens > max/2."""

    __slots__ = ("spec", "tokens", "threshold")

    def __init__(self, spec: ThrottleSpec) -> None:
        self.spec = spec
        self.tokens = float(spec.max_tokens)
        self.threshold = spec.max_tokens / 2

    def on_success(self, retry: bool) -> None:
        self.tokens = min(self.spec.max_tokens, self.tokens + self.spec.token_ratio)

    def on_failure(self, retry: bool, counted: bool, overloaded: bool) -> None:
        # Only failures that would be retried (retryable / non-fatal class, or pushback "stop") count.
        if counted:
            self.tokens = max(0.0, self.tokens - 1)

    def on_request(self, now: float) -> None:
        """A client request's first attempt went out (the ratio budget counts these; A6 does not)."""

    def acquire(self, now: float = 0.0) -> bool:
        """May another attempt (retry or hedge) be sent? A6 only looks; it takes nothing."""
        return self.tokens > self.threshold

    @property
    def capacity(self) -> float:
        return self.spec.max_tokens


class MongoThrottle:
    """Client Backpressure: a retry consumes ``retry_cost`` or is refused; results deposit tokens."""

    __slots__ = ("spec", "tokens")

    def __init__(self, spec: ThrottleSpec) -> None:
        self.spec = spec
        self.tokens = float(spec.capacity)

    def _deposit(self, n: float) -> None:
        self.tokens = min(self.spec.capacity, self.tokens + n)

    def on_success(self, retry: bool) -> None:
        self._deposit(self.spec.return_rate + (self.spec.retry_cost if retry else 0.0))

    def on_failure(self, retry: bool, counted: bool, overloaded: bool) -> None:
        if retry and not overloaded:
            self._deposit(self.spec.retry_cost)

    def on_request(self, now: float) -> None:
        """Client Backpressure does not count first attempts."""

    def acquire(self, now: float = 0.0) -> bool:
        if self.tokens >= self.spec.retry_cost:
            self.tokens -= self.spec.retry_cost
            return True
        return False

    @property
    def capacity(self) -> float:
        return self.spec.capacity


class RetryBudget:
    """Retries + hedges <= ``ratio`` x the client requests over ``window``, plus a floor bucket refilled at
    ``min_per_second`` (capacity ``min_per_second``).

    Two parts, spent in this order: the ratio pool (each client request deposits ``ratio``; the pool never
    holds more than ``ratio`` x the requests of the last ``window``, an exponentially decayed count) and the
    floor. Over any stretch of time, retries <= ratio x requests (+ the pool at its start) + the floor's refill.

    Alone (``scope: local``, or a fleet member that cannot reach Redis) it refills itself. Leased (a fleet
    member, ``sidecar.fleet``): it spends only the ``lease`` the fleet granted it, and keeps counting what the
    fleet needs to know (requests, demand) for the next settle. Alone again (``stand_alone``), it keeps what
    is left of its lease and refills at its share of the floor.
    """

    __slots__ = (
        "ratio",
        "window",
        "rate",
        "capacity",
        "pool",
        "floor",
        "seen",
        "last",
        "step",
        "requests",
        "counted",
        "wanted",
        "granted",
        "refused",
        "leased",
        "lease",
    )

    def __init__(self, ratio: float, min_per_second: float, window: float, now: float = 0.0) -> None:
        self.ratio = ratio
        self.window = window
        self.rate = min_per_second  # the floor's refill per second (a fleet member alone: its share)
        self.capacity = min_per_second
        self.pool = 0.0
        self.floor = min_per_second
        self.seen = 0.0  # client requests over the window (exponentially decayed)
        self.last = now
        self.step = window / 10  # requests are folded into ``seen`` at least this often
        self.requests = 0  # client requests counted, ever (the fleet reads the difference)
        self.counted = 0  # ... of which folded into ``seen``
        self.wanted = 0  # retries asked for, ever (the fleet's measure of demand)
        self.granted = 0
        self.refused = 0
        self.leased = False
        self.lease = 0.0

    # -- the Throttle interface ----------------------------------------------------------------------
    def on_request(self, now: float) -> None:
        self.requests += 1
        if now - self.last >= self.step:
            self.advance(now)

    def on_success(self, retry: bool) -> None:
        """Results do not refill this budget: requests do."""

    def on_failure(self, retry: bool, counted: bool, overloaded: bool) -> None:
        """Results do not refill this budget: requests do."""

    def acquire(self, now: float = 0.0) -> bool:
        self.wanted += 1
        if self.allows(now):
            self.take()
            return True
        self.refused += 1
        return False

    # -- parts, for a composite that asks another throttle in between ----------------------------------
    def allows(self, now: float) -> bool:
        """Is there a retry's worth in the budget? (Takes nothing.)"""
        self.advance(now)
        if self.leased:
            return self.lease >= 1.0
        return self.pool >= 1.0 or self.floor >= 1.0

    def take(self) -> None:
        self.granted += 1
        if self.leased:
            self.lease -= 1.0
        elif self.pool >= 1.0:
            self.pool -= 1.0
        else:
            self.floor -= 1.0

    def advance(self, now: float) -> None:
        """Fold the requests counted since the last call into the window; refill the floor."""
        dt = now - self.last
        if dt < 0:
            dt = 0.0
        self.last = now
        new = self.requests - self.counted
        self.counted = self.requests
        self.seen = self.seen * exp(-dt / self.window) + new
        pool = self.pool + self.ratio * new
        cap = self.ratio * self.seen
        self.pool = pool if pool < cap else cap
        floor = self.floor + self.rate * dt
        self.floor = floor if floor < self.capacity else self.capacity

    # -- a fleet member's side ------------------------------------------------------------------------
    def lease_granted(self, tokens: float) -> None:
        """Spend from now on only ``tokens``, the fleet's grant (what is left of the last lease goes back
        with the settle that brought this one)."""
        self.leased = True
        self.lease = tokens

    def stand_alone(self, min_per_second: float) -> None:
        """Refill by itself again, with a floor of ``min_per_second`` (a fleet member's share of it).

        Leaving a lease, it keeps what is left of the lease (taken from the fleet's pool: its to spend) as
        its floor's tokens, up to the new capacity, and starts its ratio pool empty: the requests it counted
        so far were reported to the fleet, whose pool holds their deposits."""
        if self.leased:
            self.advance(self.last)  # fold the requests not yet counted, so they deposit nothing later
            self.pool = 0.0
            self.floor = self.lease
            self.leased = False
            self.lease = 0.0
        self.rate = self.capacity = min_per_second
        if self.floor > min_per_second:
            self.floor = min_per_second

    @property
    def tokens(self) -> float:
        """What may be spent now (for the throttle gauge)."""
        return self.lease if self.leased else self.pool + self.floor


class BudgetedThrottle:
    """A policy's throttle and the upstream's retry budget together: a retry or hedge needs both.

    The budget is asked first and charged last, so a refusal by either takes nothing from the other."""

    __slots__ = ("inner", "budget")

    def __init__(self, inner: GrpcThrottle | MongoThrottle, budget: RetryBudget) -> None:
        self.inner = inner
        self.budget = budget

    def on_request(self, now: float) -> None:
        self.budget.on_request(now)

    def on_success(self, retry: bool) -> None:
        self.inner.on_success(retry)

    def on_failure(self, retry: bool, counted: bool, overloaded: bool) -> None:
        self.inner.on_failure(retry, counted, overloaded)

    def acquire(self, now: float = 0.0) -> bool:
        budget = self.budget
        budget.wanted += 1
        if not budget.allows(now):
            budget.refused += 1
            return False
        if not self.inner.acquire(now):
            return False
        budget.take()
        return True

    @property
    def tokens(self) -> float:
        return self.inner.tokens

    @property
    def capacity(self) -> float:
        return self.inner.capacity


Throttle = GrpcThrottle | MongoThrottle | RetryBudget | BudgetedThrottle


def make_throttle(spec: ThrottleSpec) -> GrpcThrottle | MongoThrottle:
    if spec.kind is ThrottleKind.GRPC:
        return GrpcThrottle(spec)
    return MongoThrottle(spec)
