"""The des engine: the scenario in virtual time, driving the sidecar's real policy engine.

One heap of timed events; nothing sleeps, so an hour of traffic from 100,000 clients runs in seconds.
The server is the same :class:`~.model.ModelServer` the live engine serves HTTP with, checked every
``server.tick``. A ``stop`` outage freezes it: arrivals queue, as in a stopped process's kernel, up to
``server.backlog``, and enter together when it resumes; a connection beyond the backlog is tried again by
the client's kernel 1, 3, 7, ... s later (SYN retransmission) while its client still waits.

The ``sidecar`` strategy builds a real :class:`sidecar.policy.Call` per request, with a real
:class:`~sidecar.upstream.balancer.Balancer` and retry budget (``make_throttle``) per sidecar instance,
the policy compiled by the sidecar's own config loader; virtual ``now`` and a seeded random go in. What
the runtime does with the commands (send, cancel, wake, finish) is done here with events. An attempt the
engine cancels (per-try timeout, deadline, lost hedge) is abandoned: the server still works on it.

A sidecar may also have a request limiter at its door (``limiter``: a factory of
:class:`sidecar.admission.RateLimiter`, one per instance, given virtual ``now``): a request then waits for its
borrowed token before its ``Call`` starts, or is refused at once and ends without an attempt (counted in
``Sidecar.rejected``; its client sees a failure). Not yet a scenario key: the admission wiring will add one.

An upstream ``concurrency`` block (``sidecar.upstream.concurrency``, issue 12's execution control) gives each
sidecar instance the real per-endpoint ticket pools (``sidecar.admission.EndpointConcurrency``, its prober
run every ``interval`` of virtual time): every attempt takes a read ticket (the model's requests are GETs)
before it is submitted, queues for one, or is refused and reported to the engine as overloaded, as
``sidecar/gates/ticket_gate.py`` does on the loop; its ticket comes back when it is answered, or, abandoned,
when its endpoint answers an attempt sent after it, or after as long again as it had been outstanding, at
most ``abandoned_hold`` (the model server does the work all the same). The ``sidecar+tickets`` strategy is the sidecar with ``sidecar.tickets`` as that block.

An upstream ``retry_budget`` (``sidecar.upstream.retry_budget``) is one ``RetryBudget`` per instance with
``scope: local``, and one shared by every instance with ``scope: fleet``: the fleet budget as the Redis
leases approximate it, without their lag (a lease period) or Redis outages.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from typing import Any

from ..admission import EndpointConcurrency, Kind, RateLimiter, Rejection
from ..admission.reasons import Limiter
from ..admission.refusal import Refusal
from ..gates.concurrency import probe_spec
from ..gates.ticket_gate import refused_outcome
from ..policy import (
    START,
    TICK,
    AttemptEnded,
    BudgetedThrottle,
    Call,
    CancelAttempt,
    Finish,
    Reason,
    RetryBudget,
    SendAttempt,
    Throttle,
    Wake,
    make_throttle,
)
from ..upstream.balancer import Balancer
from .model import OK, ModelServer
from .policy import SidecarPolicy, budget_scope, compile_policy
from .record import Record
from .retry import Waits, mean_gap
from .scenario import SIDECAR_STRATEGIES, Scenario

INF = math.inf
SYN_RETRY = 1.0  # Linux's first SYN retransmission timeout
#: How a request refused by the limiter ends: no attempt was made (the retry budget is not involved).
REJECTED = Finish(Reason.THROTTLED, None, None, 0)

LimiterFactory = Callable[[float], RateLimiter]  # now -> a new limiter


class Loop:
    """Virtual time: ``at(t, fn, *args)`` runs ``fn(*args)`` when the clock reaches ``t``."""

    __slots__ = ("now", "_queue", "_seq")

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (t, self._seq, fn, args))

    def run(self, until: float) -> None:
        q = self._queue
        pop = heapq.heappop
        while q and q[0][0] < until:
            t, _, fn, args = pop(q)
            self.now = t
            fn(*args)
        self.now = until


class Job:
    """One attempt at the server. ``answer(status)`` is called when it is answered, unless abandoned."""

    __slots__ = ("answer",)

    def __init__(self, answer: Callable[[int], None] | None) -> None:
        self.answer = answer


class Servers:
    """The server replicas in virtual time, with the outage applied."""

    def __init__(self, loop: Loop, s: Scenario, rec: Record) -> None:
        self.loop = loop
        self.rec = rec
        self.spec = s.server
        self.outage = s.outage
        rand = random.Random(f"{s.seed}-server")
        self.replicas = [ModelServer(s.server, s.outage, rand) for _ in range(s.server.replicas)]
        self.stopped = False
        self.backlogs: list[deque[Job]] = [deque() for _ in self.replicas]
        self.submitted = [0] * len(self.replicas)  # attempts sent to each replica
        o = s.outage
        if o is not None and o.mode == "stop":
            loop.at(o.start, self._stop)
            loop.at(o.end, self._resume)
        loop.at(0.0, self._tick)

    def submit(self, replica: int, job: Job, syn_wait: float = SYN_RETRY) -> None:
        if syn_wait == SYN_RETRY:  # a new attempt, not the kernel trying it again
            self.submitted[replica] += 1
        if self.stopped:
            backlog = self.backlogs[replica]
            if len(backlog) < self.spec.backlog:
                backlog.append(job)
            else:
                # The kernel drops the connection attempt; the client's kernel tries again later (TCP SYN
                # retransmission: after 1 s, then 2 s, 4 s, ...) for as long as the client still waits.
                self.loop.at(self.loop.now + syn_wait, self._syn_again, replica, job, 2 * syn_wait)
            return
        status = self.replicas[replica].admit(self.loop.now, job)
        if status is not None:  # answered at once: still an event of its own, never a nested call
            self.loop.at(self.loop.now, self._deliver, job, status)

    def _syn_again(self, replica: int, job: Job, syn_wait: float) -> None:
        if job.answer is not None:  # not abandoned
            self.submit(replica, job, syn_wait)

    def inflight(self) -> int:
        return sum(r.inflight for r in self.replicas)

    @staticmethod
    def _deliver(job: Job, status: int) -> None:
        answer = job.answer
        if answer is not None:
            job.answer = None
            answer(status)

    def _tick(self) -> None:
        loop = self.loop
        now = loop.now
        if not self.stopped:
            for r in self.replicas:
                if r.inflight:
                    for job, status in r.due(now):
                        self._deliver(job, status)  # type: ignore[arg-type]
            self.rec.inflight(now, self.inflight())
        loop.at(now + self.spec.tick, self._tick)

    def _stop(self) -> None:
        self.stopped = True

    def _resume(self) -> None:
        self.stopped = False
        now = self.loop.now
        for replica, backlog in zip(self.replicas, self.backlogs, strict=True):
            while backlog:
                job = backlog.popleft()
                status = replica.admit(now, job)
                if status is not None:
                    self.loop.at(now, self._deliver, job, status)
        self.rec.inflight(now, self.inflight())


class _Client:
    __slots__ = ("since", "job", "waits", "attempts")

    def __init__(self) -> None:
        self.since: float | None = None  # when the request in progress started
        self.job: Job | None = None
        self.waits: Waits | None = None
        self.attempts = 0  # of the request in progress


class DirectClients:
    """``fixed`` and ``backoff``: each client retries its own failed or timed-out attempts."""

    def __init__(self, loop: Loop, s: Scenario, servers: Servers, rec: Record, strategy: str) -> None:
        self.loop = loop
        self.s = s
        self.spec = s.clients
        self.servers = servers
        self.rec = rec
        self.strategy = strategy
        self.rand = random.Random(f"{s.seed}-clients")
        self.gap = mean_gap(s.clients)
        self.clients = [_Client() for _ in range(s.clients.count)]
        self.max_attempts_seen = 0  # the most attempts any request made
        for c in self.clients:
            loop.at(self.rand.expovariate(1.0 / self.gap), self._begin, c)

    def _begin(self, c: _Client) -> None:
        now = self.loop.now
        c.since = now
        c.waits = None
        c.attempts = 0
        self.rec.started(now)
        self._send(c)

    def _send(self, c: _Client) -> None:
        now = self.loop.now
        c.attempts += 1
        if c.attempts > self.max_attempts_seen:
            self.max_attempts_seen = c.attempts
        job = Job(None)
        job.answer = lambda status: self._answered(c, job, status)
        c.job = job
        self.rec.attempt(now)
        replica = int(self.rand.random() * len(self.servers.replicas))
        self.servers.submit(replica, job)
        self.loop.at(now + self.spec.timeout, self._timed_out, c, job)

    def _answered(self, c: _Client, job: Job, status: int) -> None:
        c.job = None
        now = self.loop.now
        if status == OK:
            self._end(c, True)
        else:
            self.rec.error(now)
            self._retry(c)

    def _timed_out(self, c: _Client, job: Job) -> None:
        if c.job is not job:
            return
        job.answer = None  # abandoned: the server still works on it
        c.job = None
        self.rec.timeout(self.loop.now)
        self._retry(c)

    def _retry(self, c: _Client) -> None:
        now = self.loop.now
        assert c.since is not None
        limit = self.spec.max_attempts
        if now - c.since >= self.spec.patience or (limit is not None and c.attempts >= limit):
            self._end(c, False)
            return
        if c.waits is None:
            c.waits = Waits(self.strategy, self.spec, self.rand)
        self.loop.at(now + c.waits.next(), self._send, c)

    def _end(self, c: _Client, ok: bool) -> None:
        now = self.loop.now
        assert c.since is not None
        self.rec.ended(now, c.since, ok)
        c.since = None
        self.loop.at(now + self.rand.expovariate(1.0 / self.gap), self._begin, c)

    def open_requests(self) -> list[float]:
        return [c.since for c in self.clients if c.since is not None]


class _Request:
    __slots__ = ("call", "jobs", "wake", "done", "sent", "held", "since", "waits")

    def __init__(self, call: Call, done: Callable[[Finish], None]) -> None:
        self.call = call
        self.sent = 0
        self.jobs: dict[int, Job] = {}
        self.held: dict[int, str] = {}  # attempt -> the endpoint whose ticket it holds
        self.since: dict[int, float] = {}  # attempt -> when it got that ticket
        self.waits: dict[int, tuple[str, int]] = {}  # attempt -> (endpoint, waiter) queued for a ticket
        self.wake = 0  # generation of the latest Wake: older wake events are ignored
        self.done = done


class Sidecar:
    """One sidecar instance: its balancer and retry budget, carrying out the engine's commands in events."""

    def __init__(
        self,
        loop: Loop,
        policy: SidecarPolicy,
        servers: Servers,
        rec: Record,
        rand: random.Random,
        limiter: RateLimiter | None = None,
        budget: RetryBudget | None = None,
    ) -> None:
        self.loop = loop
        self.limiter = limiter
        self.rejected = 0  # requests the limiter refused
        self.policy = policy
        self.servers = servers
        self.rec = rec
        self.rand = rand.random
        self.endpoints = [f"replica-{i}:{i}" for i in range(len(servers.replicas))]
        self.replica_of = {e: i for i, e in enumerate(self.endpoints)}
        self.balancer = Balancer(self.endpoints, cooldown=policy.upstream.overload_cooldown)
        spec = policy.engine.throttle
        own = make_throttle(spec) if spec is not None else None
        self.throttle: Throttle | None = own
        if budget is not None:
            self.throttle = budget if own is None else BudgetedThrottle(own, budget)
        self.attempts = 0
        self.max_attempts_seen = 0  # the most attempts any request made (counted here, not by the engine)
        cc = policy.upstream.concurrency
        self.tickets: dict[str, EndpointConcurrency] | None = None
        self.ticket_refusals = 0  # attempts refused a ticket (queue full, max_wait)
        self.waiting: dict[tuple[str, int], tuple[_Request, SendAttempt]] = {}
        self.abandoned_hold = 0.0
        # tickets of abandoned attempts, by endpoint, by when they were sent: [still held]
        self.abandoned: dict[str, list[tuple[float, int, list[bool]]]] = {e: [] for e in self.endpoints}
        self._seq = 0
        if cc is not None:
            self.abandoned_hold = cc.abandoned_hold
            probing = cc.mode == "probing"
            self.tickets = {
                e: EndpointConcurrency(probe_spec(cc), loop.now, probing, cc.max_queue, cc.max_wait)
                for e in self.endpoints
            }
            if probing:
                loop.at(loop.now + cc.interval, self._probe, cc.interval)

    def request(self, deadline: float, done: Callable[[Finish], None]) -> None:
        limiter = self.limiter
        if limiter is None:
            self._start(deadline, done)
            return
        d = limiter.acquire(self.loop.now, deadline)
        if d.admitted:
            self._start(deadline, done)
        elif d.queued:
            self.loop.at(d.at, self._dequeued, d.waiter, deadline, done)
        else:
            self.rejected += 1
            done(REJECTED)

    def _dequeued(self, waiter: int, deadline: float, done: Callable[[Finish], None]) -> None:
        assert self.limiter is not None
        self.limiter.admit_queued(waiter)  # (its wait ends before its deadline: the limiter saw to that)
        self._start(deadline, done)

    def _start(self, deadline: float, done: Callable[[Finish], None]) -> None:
        call = Call(
            self.policy.engine,
            picker=self.balancer,
            rand=self.rand,
            deadline=deadline,
            throttle=self.throttle,
        )
        self._feed(_Request(call, done), START)

    def _feed(self, r: _Request, event: Any) -> None:
        loop = self.loop
        now = loop.now
        for cmd in r.call.handle(event, now):
            t = type(cmd)
            if t is SendAttempt:
                self._send(r, cmd)  # type: ignore[arg-type]
            elif t is Wake:
                r.wake += 1
                if cmd.at < INF:  # type: ignore[union-attr]
                    loop.at(cmd.at, self._tick, r, r.wake)  # type: ignore[union-attr]
            elif t is CancelAttempt:
                n = cmd.attempt  # type: ignore[union-attr]
                job = r.jobs.pop(n, None)
                if job is not None:
                    job.answer = None  # abandoned: the server still works on it
                if self.tickets is not None:
                    self._unticket(r, n, abandoned=True)
            elif t is Finish:
                r.done(cmd)  # type: ignore[arg-type]

    def _send(self, r: _Request, cmd: SendAttempt) -> None:
        tickets = self.tickets
        if tickets is None:
            self._submit(r, cmd)
            return
        now = self.loop.now
        deadline = now + cmd.timeout  # the engine cancels a wait that reaches the attempt's own expiry
        d = tickets[cmd.endpoint].pools.pool(Kind.READ).acquire(now, deadline)
        if d.admitted:
            r.held[cmd.attempt] = cmd.endpoint
            r.since[cmd.attempt] = now
            self._submit(r, cmd)
        elif d.queued:
            r.waits[cmd.attempt] = (cmd.endpoint, d.waiter)
            self.waiting[(cmd.endpoint, d.waiter)] = (r, cmd)
            if d.at < deadline:
                self.loop.at(d.at, self._gave_up, r, cmd, d.waiter)
        else:
            self._refuse(r, cmd, d.reason if d.reason is not None else Rejection.QUEUE_FULL)

    def _refuse(self, r: _Request, cmd: SendAttempt, reason: Rejection) -> None:
        self.ticket_refusals += 1
        refusal = Refusal(Limiter.CONCURRENCY, reason, 0.0)
        # an event of its own: the engine is never re-entered while its commands are carried out
        self.loop.at(self.loop.now, self._feed, r, AttemptEnded(cmd.attempt, refused_outcome(refusal)))

    def _gave_up(self, r: _Request, cmd: SendAttempt, waiter: int) -> None:
        if r.waits.get(cmd.attempt) != (cmd.endpoint, waiter):
            return  # granted or cancelled meanwhile
        del r.waits[cmd.attempt]
        del self.waiting[(cmd.endpoint, waiter)]
        assert self.tickets is not None
        reason = self.tickets[cmd.endpoint].pools.pool(Kind.READ).give_up(waiter)
        if reason is not None:
            self._refuse(r, cmd, reason)

    def _unticket(self, r: _Request, n: int, abandoned: bool = False) -> None:
        """Attempt ``n`` is over: answered, and its ticket goes back (and so do the abandoned ones sent to
        its endpoint before it); or ``abandoned`` by the engine, and its ticket stays held (counted
        abandoned) until then, or as long again as it was outstanding, at most ``abandoned_hold``, as the
        ticket gate does (the model server does the work all the same). A queued attempt leaves the queue."""
        assert self.tickets is not None
        queued = r.waits.pop(n, None)
        if queued is not None:
            endpoint, waiter = queued
            del self.waiting[queued]
            self.tickets[endpoint].pools.pool(Kind.READ).cancel(waiter)
            return
        endpoint = r.held.pop(n, None)
        if endpoint is None:
            return
        since = r.since.pop(n)
        hold = min(self.abandoned_hold, self.loop.now - since)
        if abandoned and hold > 0:
            self.tickets[endpoint].pools.pool(Kind.READ).abandon()
            ticket = [True]  # still held
            self._seq += 1
            heapq.heappush(self.abandoned[endpoint], (since, self._seq, ticket))
            self.loop.at(self.loop.now + hold, self._let_go, endpoint, ticket)
            return
        self._release(endpoint)
        if not abandoned:
            heap = self.abandoned[endpoint]
            while heap and heap[0][0] < since:  # the endpoint moved past them
                self._let_go(endpoint, heapq.heappop(heap)[2])

    def _let_go(self, endpoint: str, ticket: list[bool]) -> None:
        if ticket[0]:
            ticket[0] = False
            self._release(endpoint, abandoned=True)

    def _release(self, endpoint: str, abandoned: bool = False) -> None:
        assert self.tickets is not None
        waiter = self.tickets[endpoint].pools.pool(Kind.READ).release(abandoned)
        if waiter:
            self._granted(endpoint, waiter)

    def _granted(self, endpoint: str, waiter: int) -> None:
        r, cmd = self.waiting.pop((endpoint, waiter))
        del r.waits[cmd.attempt]
        r.held[cmd.attempt] = endpoint
        r.since[cmd.attempt] = self.loop.now
        self._submit(r, cmd)

    def _probe(self, interval: float) -> None:
        assert self.tickets is not None
        now = self.loop.now
        for endpoint, ec in self.tickets.items():
            for _, waiter in ec.on_interval(now):
                self._granted(endpoint, waiter)
        self.loop.at(now + interval, self._probe, interval)

    def _submit(self, r: _Request, cmd: SendAttempt) -> None:
        n = cmd.attempt
        r.sent += 1
        if r.sent > self.max_attempts_seen:
            self.max_attempts_seen = r.sent
        job = Job(None)
        job.answer = lambda status: self._answered(r, n, status)
        r.jobs[n] = job
        self.attempts += 1
        self.rec.attempt(self.loop.now)
        self.servers.submit(self.replica_of[cmd.endpoint], job)

    def _answered(self, r: _Request, n: int, status: int) -> None:
        if r.jobs.pop(n, None) is None:
            return
        if self.tickets is not None:
            self._unticket(r, n)
        self._feed(r, AttemptEnded(n, self.policy.classify(status)))

    def _tick(self, r: _Request, generation: int) -> None:
        if generation == r.wake and not r.call.finished:
            self._feed(r, TICK)


class SidecarClients:
    """``sidecar``: each client sends once, through its sidecar, with its timeout as the deadline."""

    def __init__(
        self,
        loop: Loop,
        s: Scenario,
        servers: Servers,
        rec: Record,
        limiter: LimiterFactory | None = None,
        tickets: bool = False,
    ) -> None:
        """``tickets``: the ``sidecar+tickets`` strategy (the upstream with ``sidecar.tickets``)."""
        self.loop = loop
        self.spec = s.clients
        self.rec = rec
        self.rand = random.Random(f"{s.seed}-clients")
        self.gap = mean_gap(s.clients)
        policy = compile_policy(s, [f"replica-{i}:{i}" for i in range(s.server.replicas)], tickets)
        sidecar_rand = random.Random(f"{s.seed}-sidecar")
        rb = policy.upstream.retry_budget
        fleet = None
        if rb is not None and budget_scope(s) == "fleet":
            fleet = RetryBudget(rb.ratio, rb.min_per_second, rb.window, loop.now)

        def budget() -> RetryBudget | None:
            if rb is None:
                return None
            return (
                fleet if fleet is not None else RetryBudget(rb.ratio, rb.min_per_second, rb.window, loop.now)
            )

        self.sidecars = [
            Sidecar(
                loop, policy, servers, rec, sidecar_rand, limiter(loop.now) if limiter else None, budget()
            )
            for _ in range(s.sidecar.instances)
        ]
        self.clients = [_Client() for _ in range(s.clients.count)]
        for i, c in enumerate(self.clients):
            loop.at(self.rand.expovariate(1.0 / self.gap), self._begin, i, c)

    def _begin(self, i: int, c: _Client) -> None:
        now = self.loop.now
        c.since = now
        self.rec.started(now)
        sidecar = self.sidecars[i % len(self.sidecars)]
        sidecar.request(now + self.spec.timeout, lambda f: self._done(i, c, f))

    def _done(self, i: int, c: _Client, f: Finish) -> None:
        now = self.loop.now
        assert c.since is not None
        ok = f.outcome is not None and f.outcome.ok
        if not ok:
            if f.reason is Reason.DEADLINE:
                self.rec.timeout(now)
            else:
                self.rec.error(now)
        self.rec.ended(now, c.since, ok)
        c.since = None
        self.loop.at(now + self.rand.expovariate(1.0 / self.gap), self._begin, i, c)

    def open_requests(self) -> list[float]:
        return [c.since for c in self.clients if c.since is not None]

    @property
    def max_attempts_seen(self) -> int:
        return max(sc.max_attempts_seen for sc in self.sidecars)


def run(s: Scenario, strategy: str, limiter: LimiterFactory | None = None) -> Record:
    """Run one strategy through the scenario; the per-second record. ``limiter``: sidecar strategies only."""
    return simulate(s, strategy, limiter)[0]


def simulate(
    s: Scenario, strategy: str, limiter: LimiterFactory | None = None
) -> tuple[Record, DirectClients | SidecarClients]:
    """Like :func:`run`, and the clients object too (tests look inside: attempts per request, sidecars)."""
    loop = Loop()
    rec = Record(s.duration)
    servers = Servers(loop, s, rec)
    clients: DirectClients | SidecarClients
    if strategy in SIDECAR_STRATEGIES:
        clients = SidecarClients(loop, s, servers, rec, limiter, tickets=strategy == "sidecar+tickets")
    else:
        if limiter is not None:
            raise ValueError(f"a request limiter sits in a sidecar: not with the {strategy!r} strategy")
        clients = DirectClients(loop, s, servers, rec, strategy)
    loop.run(s.duration)
    rec.open_at_end(clients.open_requests(), s.duration, s.clients.timeout)
    rec.fill_inflight()
    return rec, clients
