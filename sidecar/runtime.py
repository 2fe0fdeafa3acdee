"""The one driver of engine commands on the event loop.

A :class:`Driver` owns one request's engine :class:`~sidecar.policy.Call`. It feeds the engine its events and
carries out its commands at once, from whatever callback brought the event: ``SendAttempt`` starts an
attempt through the adapter's :class:`CallbackAttempter`, ``CancelAttempt`` abandons one, ``Wake`` arms an
entry on the loop's shared timer heap (``timers.py``), ``Decision`` goes to the observer and ``Finish``
ends the request: its :class:`CallOwner` gets the engine's finish and the payload of the attempt to deliver
(every other payload is handed back to the attempter to discard). Events raised while commands are being
carried out (an attempt that fails at once, a commit) are queued and handled right after: the engine is
never re-entered.

A bug is contained to its request: an exception from the engine, an observer hook or the adapter's
``cancel`` while a request's events are handled ends that request alone with ``Finish(internal-error)``
(each adapter answers it with its protocol's error), logged once with what the observer says the request
is; the loop's other requests, and the timer heap's other wake-ups, go on.

A request to an upstream with a ``concurrency`` block has an :class:`AttemptGate`: its attempts start, are cancelled
and are discarded through it (each waits there for its ticket; ``ticket_gate.py``). A cancelled attempt may
keep its ticket until the upstream can be taken to have let the request go; the one signal for it is
protocol-neutral: the adapter's attempt calls ``AttemptContext.let_go`` where it learns that none of the
attempt was sent, and the driver itself says so of an answer that arrives after the cancel (and is discarded).

No coroutine, task or loop timer is needed per request, so an adapter built on protocol callbacks (HTTP)
pays only for the engine itself. Adapters written as coroutines (gRPC, MongoDB) use :func:`drive`, which
runs each ``async send`` in a task of its own and returns a :class:`Delivery`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, Protocol

from mypy_extensions import mypyc_attr

from .policy import (
    CLIENT_GONE,
    REQUEST_COMPLETE,
    START,
    TICK,
    AttemptEnded,
    Call,
    CancelAttempt,
    Committed,
    Decision,
    Finish,
    Outcome,
    OutcomeClass,
    Reason,
    SendAttempt,
    Wake,
)
from .policy.events import BUFFER_EXCEEDED, Event
from .timers import TimerEntry, Timers, timers_for

log: Final = logging.getLogger("sidecar.runtime")
INF: Final = math.inf


class AttemptResult:
    """What an attempt produced: its classification, and the protocol's response object (opaque here)."""

    __slots__ = ("outcome", "payload")

    def __init__(self, outcome: Outcome, payload: Any = None) -> None:
        self.outcome = outcome
        self.payload = payload


class AttemptContext:
    """Handed to the attempter with each attempt."""

    __slots__ = ("attempt", "headers", "now", "_driver")

    def __init__(self, attempt: SendAttempt, headers: Mapping[str, str], now: float, driver: Driver) -> None:
        self.attempt = attempt
        #: extra headers/metadata to send with this attempt (trace context of the attempt span)
        self.headers = headers
        #: the loop time the engine decided on this attempt (its per-try timeout counts from here)
        self.now = now
        self._driver = driver

    def done(self, result: AttemptResult) -> None:
        """The attempt has its result (callback attempters report here; exactly once, unless cancelled)."""
        self._driver.attempt_done(self.attempt.attempt, result)

    def answer(self, outcome: Outcome, payload: Any = None) -> None:
        """``done(AttemptResult(outcome, payload))``, without building the result."""
        self._driver.attempt_answered(self.attempt.attempt, outcome, payload)

    def commit(self) -> bool:
        """Part of this attempt's response is going to the client: no other attempt may follow. Whether this
        attempt holds the commit now (``False``: another one got there first, or the call is over)."""
        return self._driver.commit(self.attempt.attempt)

    def buffer_exceeded(self) -> None:
        """The request body outgrew the replay buffer while this attempt was sending it."""
        self._driver.feed(BUFFER_EXCEEDED)

    def let_go(self) -> None:
        """This attempt, cancelled, holds nothing at the upstream any more: none of it had been sent. (An
        answer that arrives after all is discarded by the driver, which says so itself.) What the attempt
        held for the upstream's sake goes back now (:meth:`AttemptGate.let_go`)."""
        self._driver.let_go(self.attempt.attempt)


@mypyc_attr(allow_interpreted_subclasses=True)
class CallbackAttempter:
    """How an adapter sends attempts for the :class:`Driver`. A base class rather than a Protocol: compiled,
    the driver's calls through it are direct."""

    def start(self, cmd: SendAttempt, ctx: AttemptContext) -> None:
        """Begin attempt ``cmd``; report its result with ``ctx.done(...)`` (at once or later)."""
        raise NotImplementedError

    def cancel(self, attempt: int) -> None:
        """Abandon attempt ``attempt`` (close or cleanly return its connection); no result is expected."""
        raise NotImplementedError

    def discard(self, payload: Any) -> None:
        """Release a result that will not be delivered (read/close its body, return its connection)."""
        raise NotImplementedError


@mypyc_attr(allow_interpreted_subclasses=True)
class AttemptGate:
    """Where an attempt waits for its ticket (admission's execution control, ``sidecar/gates/ticket_gate.py``): the
    :class:`Driver` of a request to an upstream with a ``concurrency`` block starts, cancels and discards its
    attempts through one, and tells it when an attempt has ended. A gate may start the attempt at once, later
    (once a ticket is free), or answer it itself (``ctx.answer``: refused). This base lets everything through;
    a request without a gate pays nothing. A base class rather than a Protocol: compiled, calls are direct."""

    def start(self, cmd: SendAttempt, ctx: AttemptContext, attempter: CallbackAttempter) -> None:
        attempter.start(cmd, ctx)

    def ended(self, attempt: int) -> None:
        """Attempt ``attempt`` reported its result (whatever it is): what it held goes back."""

    def cancel(self, attempt: int, attempter: CallbackAttempter) -> None:
        """Abandon attempt ``attempt``, started or still waiting: what it waited for goes back now, what it
        holds for the upstream's sake when the upstream can be taken to have let it go (:meth:`let_go`)."""
        attempter.cancel(attempt)

    def let_go(self, attempt: int) -> None:
        """Abandoned ``attempt`` holds nothing at the upstream any more (none of it was sent, or its answer
        arrived and was discarded)."""

    def discard(self, payload: Any, attempter: CallbackAttempter) -> None:
        """Release a result that will not be delivered (the gate's own refusals hold nothing)."""
        attempter.discard(payload)


class Attempter(Protocol):
    """How a coroutine adapter sends attempts for :func:`drive`."""

    async def send(self, cmd: SendAttempt, ctx: AttemptContext) -> AttemptResult:
        """Send one attempt and classify its result. Cancellation means: abandon it (close or return the
        connection). Exceptions are bugs; the runtime logs them and counts the attempt as ``fatal``."""
        ...

    def discard(self, payload: Any) -> None: ...


@mypyc_attr(allow_interpreted_subclasses=True)
class CallObserver:
    """What the runtime tells telemetry about a call. This base observes nothing; a base class rather than a
    Protocol: compiled, the driver's calls through it are direct."""

    _EMPTY: ClassVar[Mapping[str, str]] = {}

    def attempt_started(self, cmd: SendAttempt) -> Mapping[str, str]:
        """An attempt is being sent; the extra headers (trace context) it carries."""
        return self._EMPTY

    def attempt_ended(self, attempt: int, outcome: Outcome) -> None:
        pass

    def attempt_cancelled(self, cmd: CancelAttempt) -> None:
        pass

    def decision(self, d: Decision) -> None:
        pass

    def finished(self, f: Finish) -> None:
        pass

    def describe(self) -> str:
        """Which request this is, for a log line (listener, protocol, method...)."""
        return "a request"


#: Observes nothing (tests, benchmarks of the bare runtime): the base class is that already.
NULL_OBSERVER: Final = CallObserver()


class Delivery:
    """How a call ended: the engine's finish, and the payload of the attempt it delivers (if any)."""

    __slots__ = ("finish", "payload")

    def __init__(self, finish: Finish, payload: Any = None) -> None:
        self.finish = finish
        self.payload = payload


@mypyc_attr(allow_interpreted_subclasses=True)
class CallOwner:
    """Whoever answers for a call once it ends (an adapter's request). A base class rather than a callback:
    compiled, the driver's call is direct and no bound method is made per request."""

    def finished(self, finish: Finish, payload: Any) -> None:
        """The engine is done: ``payload`` is the chosen attempt's result (``None``: nothing to deliver).
        Called exactly once."""
        raise NotImplementedError


class Driver:
    """Carries out one call's engine commands. ``owner.finished(finish, payload)`` is called exactly once."""

    __slots__ = (
        "call",
        "attempter",
        "observer",
        "owner",
        "loop",
        "timers",
        "finish",
        "payloads",
        "live",
        "_queue",
        "_running",
        "_timer",
        "_armed",
        "gate",
    )

    def __init__(
        self,
        call: Call,
        attempter: CallbackAttempter,
        observer: CallObserver,
        owner: CallOwner,
        loop: asyncio.AbstractEventLoop,
        timers: Timers | None = None,
        gate: AttemptGate | None = None,
    ) -> None:
        """``gate``: where attempts wait for their tickets (``None``: the upstream limits nothing)."""
        self.call = call
        self.attempter = attempter
        self.observer = observer
        self.owner = owner
        self.loop = loop
        self.timers = timers if timers is not None else timers_for(loop)
        self.finish: Finish | None = None
        self.payloads: dict[int, Any] = {}
        self.live = 0  # attempts started, neither done nor cancelled: bit n for attempt n (no set per call)
        self._queue: deque[tuple[Event, float | None]] | None = None
        self._running = False
        self._timer: TimerEntry | None = None
        self._armed = INF
        self.gate = gate

    # -- events in -------------------------------------------------------------------------------------
    def start(self, now: float | None = None) -> None:
        """Begin the call (``now``: the loop time, when the caller has just read it)."""
        self.feed(START, now)

    def client_gone(self) -> None:
        """The client cancelled or disconnected: cancel what is in flight, finish ``cancelled``."""
        self.feed(CLIENT_GONE)

    def commit(self, n: int) -> bool:
        """Attempt ``n``'s response started towards the client; whether the engine took it as the one."""
        self.feed(Committed(n))
        return self.call.holds_commit(n)

    def request_complete(self, now: float | None = None) -> None:
        """The client's whole request has been received and handed to the attempts in flight (for a call
        started with ``request_complete=False``): the per-try timeouts and the sidecar's own deadline start."""
        self.feed(REQUEST_COMPLETE, now)

    def attempt_done(self, n: int, result: AttemptResult) -> None:
        self.attempt_answered(n, result.outcome, result.payload)

    def attempt_answered(self, n: int, outcome: Outcome, payload: Any) -> None:
        bit = 1 << n
        if not self.live & bit:  # cancelled, or the call is over: nobody will deliver this
            self._discard(payload)
            if self.gate is not None:  # the upstream answered it: it let it go
                self.gate.let_go(n)
            return
        self.live &= ~bit
        if self.gate is not None:
            self.gate.ended(n)
        self.observer.attempt_ended(n, outcome)
        if payload is not None:
            self.payloads[n] = payload
        self.feed(AttemptEnded(n, outcome))

    def let_go(self, n: int) -> None:
        """Cancelled attempt ``n`` holds nothing at the upstream any more (``AttemptContext.let_go``)."""
        if self.gate is not None:
            self.gate.let_go(n)

    def feed(self, event: Event, now: float | None = None) -> None:
        if self.finish is not None:
            return
        if self._running:
            if self._queue is None:
                self._queue = deque()
            self._queue.append((event, now))
            return
        self._running = True
        try:
            over = self._step(event, now)
            queue = self._queue
            while queue and not over:
                over = self._step(*queue.popleft())
        except Exception as e:  # a bug: end this request alone, never strand it
            self._running = False
            self._fail(e)
            return
        self._running = False
        if over:
            self._finished()

    # -- commands out ----------------------------------------------------------------------------------
    def _step(self, event: Event, now: float | None) -> bool:
        """Carry out the commands for ``event``; whether the call finished."""
        if now is None:
            now = self.loop.time()
        cmds = self.call.handle(event, now)
        obs = self.observer
        over = False
        for c in cmds:  # isinstance narrows: compiled, fields are then read from the struct
            if isinstance(c, SendAttempt):
                self.live |= 1 << c.attempt
                ctx = AttemptContext(c, obs.attempt_started(c), now, self)
                try:
                    if self.gate is None:
                        self.attempter.start(c, ctx)
                    else:
                        self.gate.start(c, ctx, self.attempter)
                except Exception as e:  # an adapter bug: a fatal outcome, never a hung request
                    ctx.done(_bug(c, e))
            elif isinstance(c, Wake):
                if c.at != self._armed:
                    self._arm(c.at)
            elif isinstance(c, Decision):
                obs.decision(c)
            elif isinstance(c, CancelAttempt):
                obs.attempt_cancelled(c)
                n = c.attempt
                if self.live & (1 << n):
                    self.live &= ~(1 << n)
                    self._cancel(n)
                payload = self.payloads.pop(n, None)
                if payload is not None:
                    self._discard(payload)
            elif isinstance(c, Finish):
                self.finish = c
                obs.finished(c)
                over = True
        return over

    def _arm(self, at: float) -> None:
        if at == self._armed:
            return
        if self._timer is not None:
            self.timers.cancel(self._timer)
            self._timer = None
        self._armed = at
        if at != INF:
            self._timer = self.timers.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        at, self._armed = self._armed, INF
        self.feed(TICK, max(self.loop.time(), at))

    def _finished(self) -> None:
        if self._timer is not None:
            self.timers.cancel(self._timer)
            self._timer = None
        if self.live:  # the engine cancels what is in flight; this only guards adapter bugs
            live, self.live = self.live, 0
            for n in range(live.bit_length()):
                if live & (1 << n):
                    self._cancel(n)
        f = self.finish
        assert f is not None
        payloads = self.payloads
        chosen = f.attempt
        payload = None
        if chosen is not None:
            payload = payloads.get(chosen)
            if payload is not None:
                del payloads[chosen]  # (not dict.pop: compiled, a method call; ``get`` and ``del`` are not)
        if payloads:
            for p in payloads.values():
                self._discard(p)
            payloads.clear()
        self.owner.finished(f, payload)

    def _fail(self, e: Exception) -> None:
        """The engine or an observer hook raised while handling this call's events: log it once, cancel what
        is in flight and finish ``internal-error`` (the adapter answers with its protocol's error)."""
        try:
            who = self.observer.describe()
        except Exception:
            who = "a request"
        log.error("%s ended by an internal error", who, exc_info=e)
        if self._queue is not None:
            self._queue.clear()
        try:
            self.finish = self.call.interrupt(Reason.INTERNAL)
        except Exception:  # the engine itself is what failed
            self.finish = Finish(Reason.INTERNAL, None, None, 0)
        try:
            self.observer.finished(self.finish)
        except Exception:  # the observer may be what failed: it was logged above
            log.debug("the observer could not record the internal error either")
        live, self.live = self.live, 0
        for n in range(live.bit_length()):
            if live & (1 << n):
                try:
                    self._cancel(n)
                except Exception:
                    log.exception("cancelling attempt %d after an internal error failed", n)
        self._finished()

    def _cancel(self, n: int) -> None:
        if self.gate is None:
            self.attempter.cancel(n)
        else:
            self.gate.cancel(n, self.attempter)

    def _discard(self, payload: Any) -> None:
        if payload is None:
            return
        try:
            if self.gate is None:
                self.attempter.discard(payload)
            else:
                self.gate.discard(payload, self.attempter)
        except Exception:  # pragma: no cover - adapter bug; never let it break the request
            log.exception("discarding an attempt's result failed")


def _bug(cmd: SendAttempt, e: Exception) -> AttemptResult:
    log.error("attempt %d to %s failed unexpectedly", cmd.attempt, cmd.endpoint, exc_info=e)
    return AttemptResult(Outcome(OutcomeClass.FATAL, detail=f"internal error: {type(e).__name__}"))


# -- coroutine adapters -------------------------------------------------------------------------------
class _TaskAttempter(CallbackAttempter):
    """A :class:`CallbackAttempter` running each ``async send`` in its own task."""

    __slots__ = ("attempter", "loop", "tasks")

    def __init__(self, attempter: Attempter, loop: asyncio.AbstractEventLoop) -> None:
        self.attempter = attempter
        self.loop = loop
        self.tasks: dict[int, asyncio.Task[None]] = {}

    def start(self, cmd: SendAttempt, ctx: AttemptContext) -> None:
        self.tasks[cmd.attempt] = self.loop.create_task(self._run(cmd, ctx))

    async def _run(self, cmd: SendAttempt, ctx: AttemptContext) -> None:
        try:
            result = await self.attempter.send(cmd, ctx)
        except asyncio.CancelledError:
            return
        except Exception as e:
            result = _bug(cmd, e)
        self.tasks.pop(cmd.attempt, None)
        ctx.done(result)

    def cancel(self, attempt: int) -> None:
        task = self.tasks.pop(attempt, None)
        if task is not None:
            task.cancel()

    def cancel_all(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()

    def discard(self, payload: Any) -> None:
        self.attempter.discard(payload)


class _Awaited(CallOwner):
    """:func:`drive`'s owner: the awaiting coroutine gets the :class:`Delivery`."""

    __slots__ = ("done", "tasks")

    def __init__(self, done: asyncio.Future[Delivery], tasks: _TaskAttempter) -> None:
        self.done = done
        self.tasks = tasks

    def finished(self, finish: Finish, payload: Any) -> None:
        self.tasks.cancel_all()
        if self.done.cancelled():
            if payload is not None:
                self.tasks.discard(payload)
        else:
            self.done.set_result(Delivery(finish, payload))


async def drive(
    call: Call,
    attempter: Attempter,
    observer: CallObserver = NULL_OBSERVER,
    started: Callable[[Driver], None] | None = None,
    gate: AttemptGate | None = None,
) -> Delivery:
    """Run ``call`` to its ``Finish`` with a coroutine attempter (one task per attempt). Cancelling the
    awaiting task (the client went away) cancels the attempts. ``started`` is handed the driver before the
    first attempt, for an adapter that feeds it more (``request_complete``). ``gate``: where attempts wait
    for their tickets (see :class:`AttemptGate`)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Delivery] = loop.create_future()
    tasks = _TaskAttempter(attempter, loop)
    driver = Driver(call, tasks, observer, _Awaited(done, tasks), loop, gate=gate)
    if started is not None:
        started(driver)
    driver.start()
    try:
        return await done
    except asyncio.CancelledError:
        driver.client_gone()
        tasks.cancel_all()
        if done.done() and not done.cancelled():
            late = done.result().payload
            if late is not None:
                tasks.discard(late)
        raise
