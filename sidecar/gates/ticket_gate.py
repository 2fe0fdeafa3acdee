"""Where every attempt waits for its ticket (issue 12, execution control): the runtime's
:class:`~sidecar.runtime.AttemptGate` for a request to an upstream with a ``concurrency`` block.

One gate per request, one place for all three protocols: the request's :class:`~sidecar.runtime.Driver` starts
each attempt through it. An attempt (the first, a retry or a hedge alike) takes one ticket of the request's
kind (read or write: its adapter's request room decides) from its endpoint's pool before it is started, and
holds it while it is outstanding: the ticket goes back exactly once, when the attempt reports its result.

An attempt the sidecar abandons (per-try timeout, hedge lost, client gone, the call's end) is a request the
upstream may still hold: closing its connection or stream does not make a server stop, and a stopped or
drowning one notices nothing. Its ticket stays held, counted as abandoned (``sidecar_concurrency_in_use``'s
``abandoned`` label), until the upstream can be taken to have let it go, whichever comes first:

- the endpoint answers an attempt sent after it (it has moved past it: a queue serves in order);
- the adapter says so (:meth:`TicketGate.let_go`: nothing of the attempt had reached the upstream), or its
  answer arrives after all and is discarded (the runtime's driver says so);
- as long again as the attempt had been outstanding has passed (a request the upstream has had for T seconds
  without answering is taken to need up to T more), and never more than ``concurrency.abandoned_hold``.

So the limit bounds what the upstream holds, not only what the sidecar waits for.

When no ticket is free the attempt queues (``concurrency.max_queue``, first come first served) and is started
the moment one is handed to it. An attempt cancelled while it waits leaves the queue (``TicketPool.cancel``).
Its wait is bounded by ``concurrency.max_wait`` here, and by the attempt's own timeout by the engine (which
cancels it then, as any attempt). An attempt that cannot have a ticket (the queue is full, ``max_wait`` ran
out, no time left) is not sent: it is reported as an ``overloaded`` outcome whose payload is the
:class:`~sidecar.admission.refusal.Refusal`. The engine then decides, as for an upstream that said it is
overloaded: a retry under the retry budget and backoff (preferring another endpoint), or the end of the
request, when the adapter's answer room tells the client in its protocol's words (HTTP 503, MongoDB 462,
gRPC ``RESOURCE_EXHAUSTED``), with when to come back: ``max_wait``, the time in which the queue that refused
it turns over.

Exempt operations (a MongoDB ``ping`` or ``commitTransaction``, gRPC health checks: operations that keep the
system observable or release resources, the seed's ``kExempt``) go through an :class:`ExemptGate`: never
limited, never queued, counted as exempted.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Final

from ..admission import Kind, Rejection
from ..admission.reasons import Limiter
from ..admission.refusal import Refusal
from ..policy import Outcome, OutcomeClass, SendAttempt
from ..runtime import AttemptContext, AttemptGate, AttemptResult, CallbackAttempter
from ..timers import TimerEntry, Timers, timers_for
from .concurrency import AbandonedTicket, EndpointTickets, UpstreamConcurrency

log: Final = logging.getLogger("sidecar.concurrency")
INF: Final = math.inf


def refused_outcome(refusal: Refusal) -> Outcome:
    """What the engine is told of an attempt that got no ticket: the endpoint is overloaded (seen from here),
    and the refusal is the sidecar's own (``local``: outlier detection does not count it against the
    endpoint, which never saw the attempt)."""
    return Outcome(OutcomeClass.OVERLOADED, detail=f"concurrency {refusal.reason.value}", local=True)


class _Waiting:
    """An attempt queued for a ticket."""

    __slots__ = ("gate", "ep", "cmd", "ctx", "attempter", "waiter", "since", "timer")

    def __init__(
        self,
        gate: TicketGate,
        ep: EndpointTickets,
        cmd: SendAttempt,
        ctx: AttemptContext,
        attempter: CallbackAttempter,
        waiter: int,
        since: float,
    ) -> None:
        self.gate = gate
        self.ep = ep
        self.cmd = cmd
        self.ctx = ctx
        self.attempter = attempter
        self.waiter = waiter
        self.since = since
        self.timer: TimerEntry | None = None

    def granted(self) -> None:
        self.gate.granted(self)

    def timed_out(self) -> None:
        self.timer = None
        self.gate.timed_out(self)


class TicketGate(AttemptGate):
    """The gate of one request: which of its attempts hold a ticket, which wait for one, and which were
    abandoned with one."""

    __slots__ = ("tickets", "kind", "loop", "timers", "held", "since", "waits", "abandoned")

    def __init__(self, tickets: UpstreamConcurrency, kind: Kind, loop: asyncio.AbstractEventLoop) -> None:
        self.tickets = tickets
        self.kind = kind
        self.loop = loop
        self.timers: Timers | None = None
        self.held: dict[int, EndpointTickets] = {}  # attempt -> the endpoint whose ticket it holds
        self.since: dict[int, float] = {}  # attempt -> when it got that ticket
        self.waits: dict[int, _Waiting] = {}
        self.abandoned: dict[int, AbandonedTicket] | None = None  # made at the first abandonment

    # -- the runtime's AttemptGate -------------------------------------------------------------------------
    def start(self, cmd: SendAttempt, ctx: AttemptContext, attempter: CallbackAttempter) -> None:
        ep = self.tickets.endpoint(cmd.endpoint, self.loop)
        now = ctx.now
        deadline = now + cmd.timeout  # the attempt's own expiry: the engine cancels a wait that reaches it
        decision = ep.acquire(self.kind, now, deadline)
        n = cmd.attempt
        if decision.admitted:
            self.held[n] = ep
            self.since[n] = now
            attempter.start(cmd, ctx)
            return
        if decision.queued:
            w = _Waiting(self, ep, cmd, ctx, attempter, decision.waiter, now)
            self.waits[n] = w
            ep.wait(self.kind, decision.waiter, w.granted)
            if decision.at < deadline:  # max_wait comes first: ours to end
                if self.timers is None:
                    self.timers = timers_for(self.loop)
                w.timer = self.timers.call_at(decision.at, w.timed_out)
            return
        reason = decision.reason if decision.reason is not None else Rejection.QUEUE_FULL
        self._refuse(ctx, ep, reason)

    def ended(self, attempt: int) -> None:
        ep = self.held.pop(attempt, None)
        if ep is not None:
            since = self.since.pop(attempt)
            ep.release(self.kind)
            if ep.abandoned:
                ep.answered(since)

    def cancel(self, attempt: int, attempter: CallbackAttempter) -> None:
        w = self.waits.pop(attempt, None)
        if w is not None:  # never started: it only leaves the queue
            self._unqueue(w)
            w.ep.pool(self.kind).cancel(w.waiter)
            return
        ep = self.held.pop(attempt, None)
        if ep is not None:
            self._abandon(attempt, ep, self.since.pop(attempt))
        attempter.cancel(attempt)

    def let_go(self, attempt: int) -> None:
        """The upstream can be taken to have let abandoned ``attempt`` go: its ticket comes back."""
        ticket = self.abandoned.pop(attempt, None) if self.abandoned else None
        if ticket is not None:
            ticket.ep.let_go(ticket)

    def discard(self, payload: Any, attempter: CallbackAttempter) -> None:
        if not isinstance(payload, Refusal):  # a refusal holds nothing
            attempter.discard(payload)

    # -- a queued attempt's wait ends ----------------------------------------------------------------------
    def granted(self, w: _Waiting) -> None:
        """A ticket was handed to ``w`` (it holds it now): start the attempt."""
        n = w.cmd.attempt
        if self.waits.pop(n, None) is not w:  # pragma: no cover - cancelled waiters leave the pool's queue
            w.ep.release(self.kind)
            return
        self._stop_timer(w)
        self.held[n] = w.ep
        now = self.loop.time()
        self.since[n] = now
        waited = max(0.0, now - w.since)
        w.ep.queue_time[self.kind].observe(waited)
        cmd, ctx = w.cmd, w.ctx
        if waited > 0 and cmd.timeout != INF:
            # The wait came out of the attempt's time: what it may take (the deadline it propagates upstream)
            # is what is left, counted from now; its expiry stays where the engine put it.
            cmd = SendAttempt(n, cmd.endpoint, max(0.0, cmd.timeout - waited), cmd.whole_deadline, cmd.hedge)
            ctx.attempt = cmd
        ctx.now = now
        try:
            w.attempter.start(cmd, ctx)
        except Exception as e:  # an adapter bug: a fatal outcome for this attempt, never another request's
            log.error("attempt %d to %s failed unexpectedly", n, w.cmd.endpoint, exc_info=e)
            w.ctx.done(
                AttemptResult(Outcome(OutcomeClass.FATAL, detail=f"internal error: {type(e).__name__}"))
            )

    def timed_out(self, w: _Waiting) -> None:
        """``max_wait`` ran out before a ticket came: refused."""
        if self.waits.pop(w.cmd.attempt, None) is not w:
            return
        w.ep.forget(self.kind, w.waiter)
        reason = w.ep.pool(self.kind).give_up(w.waiter)
        if reason is None:  # pragma: no cover - a granted waiter's timer is cancelled first
            self.held[w.cmd.attempt] = w.ep
            self.since[w.cmd.attempt] = self.loop.time()
            w.attempter.start(w.cmd, w.ctx)
            return
        self._refuse(w.ctx, w.ep, reason)

    # -- helpers -------------------------------------------------------------------------------------------
    def _abandon(self, attempt: int, ep: EndpointTickets, since: float) -> None:
        """``attempt``, holding a ticket of ``ep`` since ``since``, is abandoned: the ticket stays held until
        the upstream can be taken to have let it go, as long again as it was outstanding at the latest, and
        never longer than ``abandoned_hold``."""
        now = self.loop.time()
        hold = min(self.tickets.config.abandoned_hold, now - since)
        if hold <= 0:
            ep.release(self.kind)
            return
        ticket = ep.abandon(self.kind, since)
        if self.abandoned is None:
            self.abandoned = {}
        self.abandoned[attempt] = ticket
        if self.timers is None:
            self.timers = timers_for(self.loop)
        ticket.timers = self.timers
        ticket.timer = self.timers.call_at(now + hold, ticket.expire)

    def _refuse(self, ctx: AttemptContext, ep: EndpointTickets, reason: Rejection) -> None:
        pool = ep.pool(self.kind)
        refusal = Refusal(
            Limiter.CONCURRENCY,
            reason,
            pool.max_wait,
            owner=f"upstream {self.tickets.name!r} endpoint {ep.endpoint}",
        )
        ctx.answer(refused_outcome(refusal), refusal)

    def _unqueue(self, w: _Waiting) -> None:
        w.ep.forget(self.kind, w.waiter)
        self._stop_timer(w)

    def _stop_timer(self, w: _Waiting) -> None:
        if w.timer is not None and self.timers is not None:
            self.timers.cancel(w.timer)
            w.timer = None


class ExemptGate(AttemptGate):
    """An exempt operation's gate: no ticket, no queue; each attempt counted as exempted by its endpoint."""

    __slots__ = ("tickets", "kind", "loop")

    def __init__(self, tickets: UpstreamConcurrency, kind: Kind, loop: asyncio.AbstractEventLoop) -> None:
        self.tickets = tickets
        self.kind = kind
        self.loop = loop

    def start(self, cmd: SendAttempt, ctx: AttemptContext, attempter: CallbackAttempter) -> None:
        self.tickets.endpoint(cmd.endpoint, self.loop).pool(self.kind).exempt()
        attempter.start(cmd, ctx)


def gate(
    tickets: UpstreamConcurrency | None, kind: Kind, loop: asyncio.AbstractEventLoop, exempt: bool = False
) -> AttemptGate | None:
    """The gate for a request of ``kind`` to an upstream whose execution control is ``tickets`` (``None``:
    it has none, and the request needs no gate)."""
    if tickets is None:
        return None
    return ExemptGate(tickets, kind, loop) if exempt else TicketGate(tickets, kind, loop)
