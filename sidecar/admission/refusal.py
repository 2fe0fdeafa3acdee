"""A refusal: what a limiter said no to, why, and when to come back; the one value every adapter answers.

The request gate (a listener's request rate), the connection gate (a listener's new connections) and the
ticket pools (an endpoint's concurrency) each turn their ``Decision`` into a :class:`Refusal` when they say
no; each adapter's ``answer.py`` has one function that says it in the protocol's own language (issue 12):
MongoDB code 462 ``IngressRequestRateLimitExceeded`` with ``SystemOverloadedError`` + ``RetryableError``;
HTTP 429 (request rate) or 503 (concurrency) with ``Retry-After`` and, for a rate, the IETF
``RateLimit-Policy``/``RateLimit`` fields; gRPC ``RESOURCE_EXHAUSTED`` with ``grpc-retry-pushback-ms``.
The request's span carries :meth:`Refusal.attributes` (``RequestObserver.refused``).

Pure, like the rest of the package: times are plain seconds, and the value is built from a decision and the
``now`` it was made at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from .decision import Decision
from .reasons import Limiter, Rejection

_WHAT: Final = {
    Limiter.REQUESTS: "request rate limit",
    Limiter.CONNECTIONS: "connection rate limit",
    Limiter.CONCURRENCY: "concurrency limit",
}
_WHY: Final = {
    Rejection.RATE_EXCEEDED: "no token is free",
    Rejection.QUEUE_FULL: "the queue is full",
    Rejection.MAX_WAIT: "the wait would exceed max_wait",
    Rejection.DEADLINE: "the wait would pass the request's deadline",
}


@dataclass(frozen=True, slots=True)
class RatePolicy:
    """What the IETF ``RateLimit-Policy`` field says of a token bucket: ``quota`` requests per ``window``
    seconds, under the name ``name`` (draft-ietf-httpapi-ratelimit-headers: ``"name";q=quota;w=window``;
    both integers, the window at least one second)."""

    name: str
    quota: int
    window: int

    @classmethod
    def of(cls, name: str, rate: float, burst: float) -> RatePolicy:
        """A bucket refilled at ``rate`` per second with ``burst`` seconds of capacity: the window is the
        burst rounded up to whole seconds (and long enough for one whole token), the quota what the rate
        refills in it."""
        window = max(1, math.ceil(burst - 1e-9), math.ceil(1.0 / rate - 1e-9))
        return cls(name, max(1, math.floor(rate * window + 1e-9)), window)


@dataclass(frozen=True, slots=True)
class Refusal:
    """``limiter`` said no for ``reason``; ``retry_after``: seconds from now until it could say yes (0 when
    unknown). ``owner`` names whose limiter it is, for messages (``listener 'api'``, ``upstream 'db'
    endpoint 'db-0:27017'``); ``policy`` is set for a rate (requests, connections), ``None`` for tickets."""

    limiter: Limiter
    reason: Rejection
    retry_after: float
    owner: str = ""
    policy: RatePolicy | None = None

    def __post_init__(self) -> None:
        if not (self.retry_after >= 0 and math.isfinite(self.retry_after)):
            raise ValueError(f"retry_after must be 0 or more seconds, not {self.retry_after!r}")

    @classmethod
    def of(
        cls,
        limiter: Limiter,
        decision: Decision,
        now: float,
        *,
        owner: str = "",
        policy: RatePolicy | None = None,
    ) -> Refusal:
        """The refusal a rejected ``decision`` (made at ``now``) stands for; ``decision.at`` is when to come
        back (a time not after ``now``, or not finite, means unknown: 0)."""
        if decision.reason is None:
            raise ValueError(f"only a rejected decision is a refusal, not {decision!r}")
        wait = decision.at - now
        return cls(limiter, decision.reason, wait if wait > 0 and math.isfinite(wait) else 0.0, owner, policy)

    @property
    def retry_after_seconds(self) -> int:
        """Whole seconds, rounded up (``Retry-After``)."""
        return math.ceil(self.retry_after - 1e-9) if self.retry_after > 1e-9 else 0

    @property
    def retry_after_ms(self) -> int:
        """Whole milliseconds, rounded up (``grpc-retry-pushback-ms``)."""
        return math.ceil(self.retry_after * 1000 - 1e-6) if self.retry_after > 1e-9 else 0

    @property
    def message(self) -> str:
        """One line for the client and the logs, naming the limiter, the reason and when to come back (the
        adapters put ``retry-sidecar:`` before it, as in their other answers)."""
        where = f" of {self.owner}" if self.owner else ""
        when = f"; retry after {self.retry_after_ms} ms" if self.retry_after_ms else ""
        return (
            f"{_WHAT[self.limiter]}{where} exceeded "
            f"({self.reason.value}: {_WHY[self.reason]}){when}"
        )

    def attributes(self) -> dict[str, str | int]:
        """The refused request's span attributes."""
        attrs: dict[str, str | int] = {
            "sidecar.admission.limiter": self.limiter.value,
            "sidecar.admission.reason": self.reason.value,
            "sidecar.admission.retry_after_ms": self.retry_after_ms,
        }
        if self.policy is not None:
            attrs["sidecar.admission.policy"] = self.policy.name
        return attrs
