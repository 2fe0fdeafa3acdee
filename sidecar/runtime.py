"""The one asyncio driver of engine commands.

An adapter builds a :class:`~sidecar.policy.Call` for a request and hands it to :func:`drive` together with
an :class:`Attempter` (how to send one attempt over its protocol) and a :class:`CallObserver` (telemetry).
``drive`` feeds the engine its events, carries out its commands (send, cancel, wake) and returns the
:class:`Delivery`: the engine's ``Finish`` and the payload of the attempt to deliver, if any.

Two ways to run, one set of rules:
* a retrying call has at most one attempt in flight, so the attempt runs inline in the caller's task,
  interrupted at the engine's next wake by the loop's shared timer heap (``timers.py``): no task and no
  loop timer per request on the hot path;
* a hedging call runs each attempt in its own task and waits for the first of: a result, the wake time.
Every payload that is not delivered is handed back to ``Attempter.discard`` (connections returned/closed).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .policy import (
    CLIENT_GONE,
    START,
    TICK,
    AttemptEnded,
    Call,
    CancelAttempt,
    Command,
    Committed,
    Decision,
    Finish,
    Outcome,
    OutcomeClass,
    SendAttempt,
    Wake,
)
from .policy.events import BUFFER_EXCEEDED
from .timers import timers_for

log = logging.getLogger("sidecar.runtime")
INF = math.inf


@dataclass(slots=True)
class AttemptResult:
    """What an attempt produced: its classification, and the protocol's response object (opaque here)."""

    outcome: Outcome
    payload: Any = None


class AttemptContext:
    """Handed to ``Attempter.send`` with each attempt."""

    __slots__ = ("attempt", "headers", "_driver")

    def __init__(self, attempt: SendAttempt, headers: Mapping[str, str], driver: _Driver) -> None:
        self.attempt = attempt
        #: extra headers/metadata to send with this attempt (trace context of the attempt span)
        self.headers = headers
        self._driver = driver

    def commit(self) -> None:
        """Part of this attempt's response is going to the client: no other attempt may follow."""
        self._driver.feed(Committed(self.attempt.attempt))

    def buffer_exceeded(self) -> None:
        """The request body outgrew the replay buffer while this attempt was sending it."""
        self._driver.feed(BUFFER_EXCEEDED)


class Attempter(Protocol):
    async def send(self, cmd: SendAttempt, ctx: AttemptContext) -> AttemptResult:
        """Send one attempt and classify its result. Cancellation means: abandon it (close or return the
        connection). Exceptions are bugs; the runtime logs them and counts the attempt as ``fatal``."""
        ...

    def discard(self, payload: Any) -> None:
        """Release a result that will not be delivered (read/close its body, return its connection)."""
        ...


class CallObserver(Protocol):
    def attempt_started(self, cmd: SendAttempt) -> Mapping[str, str]: ...
    def attempt_ended(self, attempt: int, outcome: Outcome) -> None: ...
    def attempt_cancelled(self, cmd: CancelAttempt) -> None: ...
    def decision(self, d: Decision) -> None: ...
    def finished(self, f: Finish) -> None: ...


class NullObserver:
    """Observes nothing (tests, benchmarks of the bare runtime)."""

    _EMPTY: Mapping[str, str] = {}

    def attempt_started(self, cmd: SendAttempt) -> Mapping[str, str]:
        return self._EMPTY

    def attempt_ended(self, attempt: int, outcome: Outcome) -> None:
        pass

    def attempt_cancelled(self, cmd: CancelAttempt) -> None:
        pass

    def decision(self, d: Decision) -> None:
        pass

    def finished(self, f: Finish) -> None:
        pass


NULL_OBSERVER = NullObserver()


@dataclass(slots=True)
class Delivery:
    finish: Finish
    payload: Any = None


async def drive(call: Call, attempter: Attempter, observer: CallObserver = NULL_OBSERVER) -> Delivery:
    """Run ``call`` to its ``Finish``. Cancelling the awaiting task (client gone) cancels the attempts."""
    driver = _Driver(call, attempter, observer, asyncio.get_running_loop())
    if call.hedging is None:
        return await driver.run_inline()
    return await driver.run_tasks()


class _Driver:
    __slots__ = (
        "call",
        "attempter",
        "observer",
        "loop",
        "wake",
        "finish",
        "payloads",
        "tasks",
        "results",
        "poke",
    )

    def __init__(self, call: Call, attempter: Attempter, observer: CallObserver, loop) -> None:  # noqa: ANN001
        self.call = call
        self.attempter = attempter
        self.observer = observer
        self.loop = loop
        self.wake = INF
        self.finish: Finish | None = None
        self.payloads: dict[int, Any] = {}
        self.tasks: dict[int, asyncio.Task[AttemptResult]] = {}
        self.results: list[tuple[int, AttemptResult]] = []
        self.poke: asyncio.Future[None] | None = None

    # -- command execution ----------------------------------------------------------------------------
    def feed(self, event: Any, now: float | None = None) -> list[SendAttempt]:
        """Give the engine an event and carry out what it says; returns the attempts it wants sent."""
        if self.finish is not None:
            return []
        cmds = self.call.handle(event, self.loop.time() if now is None else now)
        return self._execute(cmds)

    def _execute(self, cmds: list[Command]) -> list[SendAttempt]:
        sends: list[SendAttempt] = []
        obs = self.observer
        for c in cmds:
            t = type(c)
            if t is SendAttempt:
                sends.append(c)  # type: ignore[arg-type]
            elif t is Wake:
                self.wake = c.at  # type: ignore[union-attr]
            elif t is Decision:
                obs.decision(c)  # type: ignore[arg-type]
            elif t is CancelAttempt:
                obs.attempt_cancelled(c)  # type: ignore[arg-type]
                task = self.tasks.pop(c.attempt, None)  # type: ignore[union-attr]
                if task is not None:
                    task.cancel()
            elif t is Finish:
                self.finish = c  # type: ignore[assignment]
                obs.finished(c)  # type: ignore[arg-type]
        if self.poke is not None and not self.poke.done():
            self.poke.set_result(None)
        return sends

    def _delivery(self) -> Delivery:
        f = self.finish
        assert f is not None
        payload = self.payloads.pop(f.attempt, None) if f.attempt is not None else None
        for p in self.payloads.values():
            self._discard(p)
        self.payloads.clear()
        return Delivery(f, payload)

    def _discard(self, payload: Any) -> None:
        if payload is None:
            return
        try:
            self.attempter.discard(payload)
        except Exception:  # pragma: no cover - adapter bug; never let it break the request
            log.exception("discarding an attempt's result failed")

    def _record(self, n: int, result: AttemptResult) -> None:
        self.observer.attempt_ended(n, result.outcome)
        if result.payload is not None:
            self.payloads[n] = result.payload

    async def _send(self, cmd: SendAttempt) -> AttemptResult:
        headers = self.observer.attempt_started(cmd)
        try:
            return await self.attempter.send(cmd, AttemptContext(cmd, headers, self))
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:
            return self._bug(cmd, e)

    def _bug(self, cmd: SendAttempt, e: Exception) -> AttemptResult:
        log.error("attempt %d to %s failed unexpectedly", cmd.attempt, cmd.endpoint, exc_info=e)
        return AttemptResult(Outcome(OutcomeClass.FATAL, detail=f"internal error: {type(e).__name__}"))

    # -- one attempt at a time, inline ----------------------------------------------------------------
    async def run_inline(self) -> Delivery:
        """Retrying calls: the attempt runs in the caller's task. The engine's wake time (per-try timeout,
        deadline) interrupts it the way ``asyncio.timeout`` does (``task.cancel()``, then ``uncancel()``), but
        on the loop's shared timer heap: no loop timer is armed per request."""
        loop = self.loop
        timers = timers_for(loop)
        task = asyncio.current_task()
        assert task is not None
        fired = False

        def interrupt() -> None:
            nonlocal fired
            fired = True
            task.cancel()

        sends = self.feed(START)
        try:
            while self.finish is None:
                wake = self.wake
                if sends:
                    cmd = sends[0]
                    headers = self.observer.attempt_started(cmd)
                    entry = timers.call_at(wake, interrupt) if wake != INF else None
                    try:
                        result = await self.attempter.send(cmd, AttemptContext(cmd, headers, self))
                    except asyncio.CancelledError:
                        if not fired:
                            raise
                        # The engine's timer fired mid-attempt (per-try timeout or deadline): the attempt
                        # is abandoned; the engine decides what follows.
                        fired = False
                        task.uncancel()
                        sends = self.feed(TICK, max(loop.time(), wake))
                        continue
                    except (KeyboardInterrupt, SystemExit):
                        raise
                    except Exception as e:
                        result = self._bug(cmd, e)
                    finally:
                        if entry is not None:
                            timers.cancel(entry)
                    if fired:  # fired after the attempt finished, before we got here: too late to matter
                        fired = False
                        task.uncancel()
                    self._record(cmd.attempt, result)
                    sends = self.feed(AttemptEnded(cmd.attempt, result.outcome))
                else:
                    if wake == INF:  # pragma: no cover - the engine always has a next step
                        raise RuntimeError("engine stalled: nothing in flight and no wake time")
                    await asyncio.sleep(max(0.0, wake - loop.time()))
                    sends = self.feed(TICK, max(loop.time(), wake))
        except asyncio.CancelledError:
            self.feed(CLIENT_GONE)
            for p in self.payloads.values():
                self._discard(p)
            self.payloads.clear()
            raise
        return self._delivery()

    # -- hedging: attempts in tasks -------------------------------------------------------------------
    async def run_tasks(self) -> Delivery:
        loop = self.loop
        try:
            self._start_tasks(self.feed(START))
            while self.finish is None:
                if self.results:
                    n, result = self.results.pop(0)
                    self._record(n, result)
                    self._start_tasks(self.feed(AttemptEnded(n, result.outcome)))
                    continue
                wake = self.wake
                now = loop.time()
                if wake <= now:
                    self._start_tasks(self.feed(TICK, max(now, wake)))
                    continue
                self.poke = loop.create_future()
                handle = loop.call_at(wake, _set_if_pending, self.poke) if wake < INF else None
                try:
                    await self.poke
                finally:
                    self.poke = None
                    if handle is not None:
                        handle.cancel()
        except asyncio.CancelledError:
            self.feed(CLIENT_GONE)
            self._cancel_all()
            raise
        self._cancel_all()
        return self._delivery()

    def _start_tasks(self, sends: list[SendAttempt]) -> None:
        for cmd in sends:
            task = self.loop.create_task(self._send(cmd))
            self.tasks[cmd.attempt] = task
            task.add_done_callback(lambda t, n=cmd.attempt: self._task_done(n, t))

    def _task_done(self, n: int, task: asyncio.Task[AttemptResult]) -> None:
        if task.cancelled():
            return
        result = task.result()
        if self.finish is not None or self.tasks.get(n) is not task:
            # Cancelled too late to stop it, or the call is over: nobody will deliver this.
            self._discard(result.payload)
            return
        del self.tasks[n]
        self.results.append((n, result))
        if self.poke is not None and not self.poke.done():
            self.poke.set_result(None)

    def _cancel_all(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()
        for _, result in self.results:
            self._discard(result.payload)
        self.results.clear()


def _set_if_pending(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
