"""The server's ingress request rate limiter (MongoDB 8.2): a token bucket refilled at ``rate`` per second
holding at most ``rate * burst_seconds``; a command that finds no token is rejected at once with code 462 and
the ``SystemOverloadedError`` + ``RetryableError`` labels (see the server admission control seed)."""

from __future__ import annotations

import time
from collections.abc import Callable

REJECTION = {
    "ok": 0.0,
    "errmsg": "Rate limiter 'ingressRequestRateLimiter' rate exceeded",
    "code": 462,
    "codeName": "IngressRequestRateLimitExceeded",
    "errorLabels": ["SystemOverloadedError", "RetryableError"],
}


class IngressRateLimiter:
    def __init__(
        self, rate: float, burst_seconds: float = 0.1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.clock = clock
        self.rate = rate
        self.capacity = max(1.0, rate * burst_seconds)
        self.tokens = self.capacity
        self.at = clock()
        self.rejected = 0
        self.admitted = 0

    def set_rate(self, rate: float, burst_seconds: float = 0.1) -> None:
        """Change the admission rate (what Mongotune does under load)."""
        self._refill()
        self.rate = rate
        self.capacity = max(1.0, rate * burst_seconds)
        self.tokens = min(self.tokens, self.capacity)

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def admit(self) -> bool:
        self._refill()
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            self.admitted += 1
            return True
        self.rejected += 1
        return False
