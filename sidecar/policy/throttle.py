"""Retry budgets shared by all requests to one upstream: gRPC A6 throttling and MongoDB's token bucket.

A bucket is plain state: it is told about results and asked about retries; it never reads a clock.
"""

from __future__ import annotations

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

    def acquire(self) -> bool:
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

    def acquire(self) -> bool:
        if self.tokens >= self.spec.retry_cost:
            self.tokens -= self.spec.retry_cost
            return True
        return False

    @property
    def capacity(self) -> float:
        return self.spec.capacity


Throttle = GrpcThrottle | MongoThrottle


def make_throttle(spec: ThrottleSpec) -> Throttle:
    if spec.kind is ThrottleKind.GRPC:
        return GrpcThrottle(spec)
    return MongoThrottle(spec)
