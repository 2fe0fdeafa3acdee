"""The seed's ``RateLimiter``: a token bucket, refilled by arithmetic rather than by a job.

As in the server (a thin wrapper around Folly's ``TokenBucket``), the bucket keeps one number, ``zero``: the
time at which it would have been empty. Its balance at ``now`` is ``min((now - zero) x rate, capacity)``,
so it refills at ``rate`` tokens per second up to ``capacity = rate x burst`` (at least 1, so that one
request can always get through; the server rejects a smaller burst). It starts full.

Queueing is by borrowing (the seed's ``acquireToken``): a request that finds no whole token takes one anyway,
leaving the balance negative, and waits until that token would have been refilled: the time at which the
balance is back at zero. Its wait is therefore known at once, and so is whether it is acceptable: a request
whose wait would exceed ``max_wait`` or reach its own deadline, or that finds ``max_queue`` requests already
waiting, is rejected now, never after waiting. Every rejection says when a token will next be free, for
``Retry-After``, ``grpc-retry-pushback-ms`` or the MongoDB error message. A queued request that is interrupted
(its client went away) gives its borrowed token back.

Rate and burst change at run time (``reconfigure``) keeping the balance, borrowed tokens included: requests
already queued keep their place and their time, and new ones queue behind them.
"""

from __future__ import annotations

import math

from .decision import Decision, Verdict, check_queue_limits
from .reasons import Rejection
from .stats import AdmissionStats

#: Float tolerance on a whole token: (now - zero) x rate may land a hair below 1.0 exactly when it is due.
_EPSILON = 1e-9


class RateLimiter:
    """One bucket (a listener's requests, or its new connections). ``now`` is any monotonic clock's seconds."""

    __slots__ = ("rate", "burst", "capacity", "max_queue", "max_wait", "stats", "_zero", "_waiting", "_last_id")

    def __init__(
        self, rate: float, burst: float, now: float, max_queue: int = 0, max_wait: float = math.inf
    ) -> None:
        self.rate = 0.0
        self.burst = 0.0
        self.capacity = 0.0
        self.max_queue = 0
        self.max_wait = 0.0
        self._set_rate(rate, burst)
        self.set_queue(max_queue, max_wait)
        self.stats = AdmissionStats()
        self._zero = now - self.capacity / self.rate  # full: one burst has accumulated
        self._waiting: dict[int, float] = {}  # queued waiter -> when its borrowed token is valid
        self._last_id = 0

    def _set_rate(self, rate: float, burst: float) -> None:
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be a positive number of requests per second, not {rate!r}")
        if not (burst > 0 and math.isfinite(burst)):
            raise ValueError(f"burst must be a positive number of seconds, not {burst!r}")
        self.rate = rate
        self.burst = burst
        self.capacity = max(1.0, rate * burst)

    def set_queue(self, max_queue: int, max_wait: float) -> None:
        """Change the queue's limits. Requests already queued stay, even beyond a smaller ``max_queue``."""
        check_queue_limits(max_queue, max_wait)
        self.max_queue = max_queue
        self.max_wait = max_wait

    def reconfigure(self, now: float, rate: float, burst: float) -> None:
        """New rate and burst (config reload). The balance carries over, capped at the new capacity; borrowed
        tokens stay borrowed, so the queue is neither dropped nor jumped."""
        balance = self.balance(now)
        self._set_rate(rate, burst)
        self._zero = now - min(balance, self.capacity) / self.rate

    # -- reading -------------------------------------------------------------------------------------------

    def balance(self, now: float) -> float:
        """Tokens in the bucket at ``now``: negative while queued requests have borrowed ahead."""
        return min((now - self._zero) * self.rate, self.capacity)

    def available(self, now: float) -> float:
        """Tokens a request could take now (the seed's ``totalAvailableTokens``; the gauge)."""
        return max(0.0, self.balance(now))

    def next_free(self, now: float) -> float:
        """When a whole token will next be free for a new request (``now`` if one is)."""
        return now + self._wait(self.balance(now))

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def _wait(self, balance: float) -> float:
        return 0.0 if balance >= 1.0 - _EPSILON else (1.0 - balance) / self.rate

    # -- deciding ------------------------------------------------------------------------------------------

    def exempt(self) -> None:
        """Count a request that was never limited (the seed's ``exemptedAdmissions``)."""
        self.stats.exempted += 1

    def take(self, now: float) -> bool:
        """The common case, cheaply: a whole token is free now and is taken (counted as attempted and
        successful), or ``False`` and nothing is done or counted (decide with :meth:`acquire` or
        :meth:`try_acquire`). No ``Decision`` is made: this runs on every admitted request."""
        balance = (now - self._zero) * self.rate
        if balance > self.capacity:
            balance = self.capacity
        if balance < 1.0 - _EPSILON:
            return False
        self._zero = now - (balance - 1.0) / self.rate
        stats = self.stats
        stats.attempted += 1
        stats.successful += 1
        return True

    def try_acquire(self, now: float) -> Decision:
        """The seed's ``tryAcquireToken``: a token now, or a rejection (``rate-exceeded``), never a wait."""
        self.stats.attempted += 1
        balance = self.balance(now)
        wait = self._wait(balance)
        if wait == 0.0:
            return self._take(now, balance)
        self.stats.reject(Rejection.RATE_EXCEEDED)
        return Decision(Verdict.REJECTED, now + wait, Rejection.RATE_EXCEEDED)

    def acquire(self, now: float, deadline: float = math.inf) -> Decision:
        """The seed's ``acquireToken``: admitted now; or queued until ``at`` (the caller waits, then calls
        :meth:`admit_queued`, or :meth:`interrupt` if its client goes away first); or rejected now, with
        ``at`` the time a token will next be free. ``deadline``: the request's own (same clock)."""
        self.stats.attempted += 1
        balance = self.balance(now)
        wait = self._wait(balance)
        if wait == 0.0:
            return self._take(now, balance)
        at = now + wait
        reason: Rejection | None = None
        if self.max_queue == 0:
            reason = Rejection.RATE_EXCEEDED
        elif len(self._waiting) >= self.max_queue:
            reason = Rejection.QUEUE_FULL
        elif wait > self.max_wait:
            reason = Rejection.MAX_WAIT
        elif at >= deadline:
            reason = Rejection.DEADLINE
        if reason is not None:
            self.stats.reject(reason)
            return Decision(Verdict.REJECTED, at, reason)
        self._zero = now - (balance - 1.0) / self.rate  # borrow: the balance goes below zero
        self._last_id += 1
        self._waiting[self._last_id] = at
        self.stats.added_to_queue += 1
        return Decision(Verdict.QUEUED, at, None, self._last_id)

    def _take(self, now: float, balance: float) -> Decision:
        self._zero = now - (balance - 1.0) / self.rate
        self.stats.successful += 1
        return Decision(Verdict.ADMITTED, now)

    def admit_queued(self, waiter: int) -> float:
        """A queued request's wait is over: it is admitted. Returns the time it was due (for the histogram of
        time spent queued)."""
        at = self._leave(waiter)
        self.stats.successful += 1
        return at

    def interrupt(self, waiter: int) -> None:
        """A queued request's client went away: it leaves the queue and gives its borrowed token back."""
        self._leave(waiter)
        self.stats.interrupted_in_queue += 1
        self._zero -= 1.0 / self.rate

    def _leave(self, waiter: int) -> float:
        at = self._waiting.pop(waiter, None)
        if at is None:
            raise KeyError(f"no request is queued as waiter {waiter} (already admitted or interrupted?)")
        self.stats.removed_from_queue += 1
        return at
