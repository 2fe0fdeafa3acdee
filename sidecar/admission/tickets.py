"""Execution control toward one endpoint: a read pool and a write pool of tickets (the seed's two
``TicketHolder``s), each with a limit (fixed, or set by the throughput prober) and a FIFO of waiters.

Every attempt to the endpoint holds one ticket from the pool of its kind while it is outstanding, and gives
it back to the same pool. When none is free the attempt queues, first come first served; what cannot be
known at once is when a ticket will free up, so a queued waiter is given the time at which it gives up
(``max_wait`` from now, or its own deadline if sooner) and the caller ends its wait one of three ways:
granted by a :meth:`TicketPool.release` or a larger limit (the pool names the waiter), timed out
(:meth:`TicketPool.give_up`) or interrupted (:meth:`TicketPool.cancel`, the client went away). What can be
known at once is decided at once: a full queue, no time to wait, a deadline already reached.

A smaller limit takes effect as tickets come back (none is revoked); a larger one grants queued waiters at
once, so a limit change never strands a waiter. The pools report what the prober needs (``Interval``):
tickets returned in the interval, whether the pool was exhausted (its peak use reached its limit, or someone
queued), its peak use, how many tickets it handed out, how many attempts it refused, and how many still wait.

A ticket whose attempt was **abandoned** (its per-try timeout, a lost hedge, the client gone) still counts
against the limit until the upstream can be taken to have let the request go (:meth:`TicketPool.abandon`,
then :meth:`TicketPool.release` with ``abandoned=True``): the sidecar giving up does not make the upstream
stop, and the limit bounds what the upstream holds, not only what the sidecar waits for. When that is, is the
caller's to say (``sidecar/gates/ticket_gate.py``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from enum import Enum

from .decision import Decision, Verdict, check_queue_limits
from .prober import Interval
from .reasons import Rejection
from .stats import AdmissionStats


class Kind(Enum):
    """Which pool an attempt uses; what counts as a read is the protocol's business (the adapters')."""

    READ = "read"
    WRITE = "write"


class TicketPool:
    __slots__ = (
        "kind",
        "limit",
        "in_use",
        "abandoned",
        "max_queue",
        "max_wait",
        "stats",
        "_waiters",
        "_last_id",
        "_peak",
        "_queued_in_interval",
        "_returned",
        "_admitted",
        "_refused",
    )

    def __init__(self, kind: Kind, limit: int, max_queue: int = 0, max_wait: float = math.inf) -> None:
        self.kind = kind
        self.limit = _check_limit(limit)
        self.in_use = 0  # tickets held, abandoned ones included
        self.abandoned = 0  # of them, held by attempts given up on (the upstream may still hold them)
        self.max_queue = 0
        self.max_wait = 0.0
        self.set_queue(max_queue, max_wait)
        self.stats = AdmissionStats()
        # waiter -> (when it gives up, the reason it will be given then); insertion order is the FIFO
        self._waiters: OrderedDict[int, tuple[float, Rejection]] = OrderedDict()
        self._last_id = 0
        self._peak = 0  # most tickets in use at once since the interval began
        self._queued_in_interval = False
        self._returned = 0
        self._admitted = 0  # tickets handed out (at once, or to a waiter)
        self._refused = 0  # attempts refused one (at once, or after waiting)

    def set_queue(self, max_queue: int, max_wait: float) -> None:
        check_queue_limits(max_queue, max_wait)
        self.max_queue = max_queue
        self.max_wait = max_wait

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @property
    def available(self) -> int:
        return max(0, self.limit - self.in_use)

    def exempt(self) -> None:
        """Count an attempt that took no ticket (an exempt operation: it releases resources or keeps the
        system observable, the seed's ``kExempt``)."""
        self.stats.exempted += 1

    def _grant(self) -> None:
        self._admitted += 1
        self.in_use += 1
        if self.in_use > self._peak:
            self._peak = self.in_use
        self.stats.successful += 1

    def try_acquire(self) -> bool:
        """A ticket now, or none (``queue-full``: a try never queues). Never ahead of a queued waiter."""
        self.stats.attempted += 1
        if self.in_use < self.limit and not self._waiters:
            self._grant()
            return True
        self._refused += 1
        self.stats.reject(Rejection.QUEUE_FULL)
        return False

    def acquire(self, now: float, deadline: float = math.inf) -> Decision:
        """Admitted (holding a ticket); queued (``waiter``; ``at``: when it gives up); or rejected now."""
        self.stats.attempted += 1
        if self.in_use < self.limit and not self._waiters:
            self._grant()
            return Decision(Verdict.ADMITTED, now)
        reason: Rejection | None = None
        if len(self._waiters) >= self.max_queue:
            reason = Rejection.QUEUE_FULL
        elif self.max_wait <= 0:
            reason = Rejection.MAX_WAIT
        elif deadline <= now:
            reason = Rejection.DEADLINE
        if reason is not None:
            self._refused += 1
            self.stats.reject(reason)
            return Decision(Verdict.REJECTED, now, reason)
        give_up, why = (
            (now + self.max_wait, Rejection.MAX_WAIT)
            if now + self.max_wait < deadline
            else (deadline, Rejection.DEADLINE)
        )
        self._last_id += 1
        self._waiters[self._last_id] = (give_up, why)
        self._queued_in_interval = True
        self.stats.added_to_queue += 1
        return Decision(Verdict.QUEUED, give_up, None, self._last_id)

    def abandon(self) -> None:
        """The attempt holding one of the tickets in use was abandoned: the ticket stays in use, counted as
        abandoned, until it is released (``release(abandoned=True)``)."""
        if self.abandoned >= self.in_use:
            raise ValueError(f"{self.kind.value} pool: a ticket was abandoned that was not held")
        self.abandoned += 1

    def release(self, abandoned: bool = False) -> int:
        """A ticket comes back (``abandoned``: one held by an abandoned attempt, whose upstream let it go).
        Returns the waiter it passes to (it now holds it), or 0 when none does."""
        if abandoned:  # (not counted as returned: the prober's throughput is work the upstream answered)
            if self.abandoned <= 0:
                raise ValueError(
                    f"{self.kind.value} pool: released an abandoned ticket that was not abandoned"
                )
            self.abandoned -= 1
        else:
            self._returned += 1
        if self._waiters and self.in_use <= self.limit:
            waiter, _ = self._waiters.popitem(last=False)
            self.stats.removed_from_queue += 1
            self.in_use -= 1
            self._grant()
            return waiter
        if self.in_use <= 0:
            raise ValueError(f"{self.kind.value} pool: a ticket was released that was never acquired")
        self.in_use -= 1
        return 0

    def set_limit(self, limit: int) -> list[int]:
        """A new limit. Returns the waiters granted by it, first come first served (none when it shrinks:
        tickets held above the new limit are not revoked, they are simply not handed on)."""
        self.limit = _check_limit(limit)
        granted: list[int] = []
        while self._waiters and self.in_use < self.limit:
            waiter, _ = self._waiters.popitem(last=False)
            self.stats.removed_from_queue += 1
            self._grant()
            granted.append(waiter)
        return granted

    def give_up(self, waiter: int) -> Rejection | None:
        """The waiter's give-up time came: it leaves the queue, rejected for the reason returned (``max-wait``
        or ``deadline``). ``None``: it is not queued any more (granted meanwhile: it holds a ticket)."""
        entry = self._waiters.pop(waiter, None)
        if entry is None:
            return None
        self.stats.removed_from_queue += 1
        self._refused += 1
        self.stats.reject(entry[1])
        return entry[1]

    def expire(self, now: float) -> list[tuple[int, Rejection]]:
        """Every waiter whose give-up time is ``now`` or earlier leaves the queue, rejected (one timer for all)."""
        due = [(w, why) for w, (at, why) in self._waiters.items() if at <= now]
        for waiter, _ in due:
            self.give_up(waiter)
        return due

    def cancel(self, waiter: int) -> bool:
        """The waiter's client went away. False: it is not queued any more (it holds a ticket to release)."""
        if self._waiters.pop(waiter, None) is None:
            return False
        self.stats.removed_from_queue += 1
        self.stats.interrupted_in_queue += 1
        return True

    def take_interval(self) -> Interval:
        """For the prober: what the pool saw since the last call, which starts a new interval."""
        report = Interval(
            self._returned,
            self._peak >= self.limit or self._queued_in_interval,
            self._peak,
            self._admitted,
            self._refused,
            len(self._waiters),
        )
        self._returned = self._admitted = self._refused = 0
        self._peak = self.in_use
        self._queued_in_interval = bool(self._waiters)
        return report


def _check_limit(limit: int) -> int:
    if limit < 1:
        raise ValueError(f"a ticket pool's limit must be 1 or more, not {limit!r}")
    return limit


class TicketPools:
    """The read and write pools of one endpoint."""

    __slots__ = ("read", "write")

    def __init__(self, read: int, write: int, max_queue: int = 0, max_wait: float = math.inf) -> None:
        self.read = TicketPool(Kind.READ, read, max_queue, max_wait)
        self.write = TicketPool(Kind.WRITE, write, max_queue, max_wait)

    def pool(self, kind: Kind) -> TicketPool:
        return self.read if kind is Kind.READ else self.write

    @property
    def limit(self) -> int:
        return self.read.limit + self.write.limit

    @property
    def in_use(self) -> int:
        return self.read.in_use + self.write.in_use

    @property
    def abandoned(self) -> int:
        return self.read.abandoned + self.write.abandoned

    def set_limits(self, read: int, write: int) -> list[tuple[Kind, int]]:
        """New limits for both pools; the waiters they grant, as (pool, waiter)."""
        granted = [(Kind.READ, w) for w in self.read.set_limit(read)]
        granted.extend((Kind.WRITE, w) for w in self.write.set_limit(write))
        return granted

    def take_interval(self) -> Interval:
        """Both pools' intervals, summed: exhausted when either was (the seed's "tickets exhausted")."""
        r = self.read.take_interval()
        w = self.write.take_interval()
        return Interval(
            r.returned + w.returned,
            r.exhausted or w.exhausted,
            r.peak + w.peak,
            r.admitted + w.admitted,
            r.refused + w.refused,
            r.queued + w.queued,
        )
