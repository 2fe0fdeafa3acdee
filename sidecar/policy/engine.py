"""The per-request retry state machine: events in, commands out (``Call.handle(event, now)``).

Pure: no sockets, no asyncio, no protocol types, no wall clock, no global random. ``now`` is passed with
every event and randomness comes from the ``rand`` callable given at construction, so every decision can be
replayed to the millisecond in a test.

One ``Call`` serves one request. It is built from an immutable :class:`RetryPolicy`, the upstream's shared
endpoint picker and throttle, and the request's own facts (deadline, which endpoints are eligible, whether
the body can be replayed, which outcome classes this request may retry). It either retries (one attempt at a
time, with backoff) or, when the policy has a ``hedging`` block, hedges (several attempts in flight).

The runtime feeds it ``Start`` once, ``AttemptEnded`` per result, ``Tick`` when a ``Wake`` time comes,
``Committed`` once a response started towards the client, ``RequestComplete`` once the whole request is
upstream (when it was not at ``Start``), ``BufferExceeded`` and ``ClientGone``. It answers
with ``SendAttempt``, ``CancelAttempt``, ``Wake``, ``Decision`` (one per ended attempt, for telemetry) and
exactly one ``Finish``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from typing import Final, Protocol

from mypy_extensions import mypyc_attr

from .backoff import BackoffSequence
from .commands import CancelAttempt, Command, Decision, Finish, SendAttempt, Wake
from .events import (
    AttemptEnded,
    BufferExceeded,
    ClientGone,
    Committed,
    Event,
    RequestComplete,
    Start,
    Tick,
)
from .outcome import Outcome, OutcomeClass, Pushback
from .reasons import Reason
from .spec import RetryPolicy
from .throttle import Throttle

INF: Final = math.inf
C: Final = OutcomeClass
Rand = Callable[[], float]


class Decide(Protocol):
    """Records the decision that followed the attempt being handled (a closure over it in ``_ended``)."""

    def __call__(self, reason: Reason, delay: float = 0.0) -> None: ...


_WON: Final = frozenset({Reason.SUCCESS, Reason.NOT_RETRYABLE, Reason.COMMITTED})
# Enum members as Final aliases, every one the code reads (the convention: sidecar/native.py).
_CLS_SUCCESS: Final = OutcomeClass.SUCCESS
_REASON_SUCCESS: Final = Reason.SUCCESS
_REASON_HEDGE_LOST: Final = Reason.HEDGE_LOST
_REASON_ATTEMPTS_EXHAUSTED: Final = Reason.ATTEMPTS_EXHAUSTED
_REASON_AWAIT_HEDGES: Final = Reason.AWAIT_HEDGES
_REASON_BUFFER_EXCEEDED: Final = Reason.BUFFER_EXCEEDED
_REASON_CANCELLED: Final = Reason.CANCELLED
_REASON_COMMITTED: Final = Reason.COMMITTED
_REASON_DEADLINE: Final = Reason.DEADLINE
_REASON_HEDGE: Final = Reason.HEDGE
_REASON_NOT_RETRYABLE: Final = Reason.NOT_RETRYABLE
_REASON_NO_ENDPOINT: Final = Reason.NO_ENDPOINT
_REASON_PER_TRY_TIMEOUT: Final = Reason.PER_TRY_TIMEOUT
_REASON_PUSHBACK_NO_RETRY: Final = Reason.PUSHBACK_NO_RETRY
_REASON_RETRY: Final = Reason.RETRY
_REASON_THROTTLED: Final = Reason.THROTTLED
_REASON_TRANSPARENT_RETRY: Final = Reason.TRANSPARENT_RETRY


@mypyc_attr(allow_interpreted_subclasses=True)
class EndpointPicker:
    """Chooses each attempt's endpoint and hears when it is done with it. A base class rather than a
    Protocol: compiled, the engine's calls through it are direct."""

    def pick(
        self,
        now: float,
        rand: Rand,
        candidates: Sequence[str] | None = None,
        avoid: Collection[str] = (),
        deprioritized: Collection[str] = (),
    ) -> str | None:
        raise NotImplementedError

    def started(self, endpoint: str) -> None:
        raise NotImplementedError

    def finished(self, endpoint: str) -> None:
        raise NotImplementedError

    def penalize(self, endpoint: str, now: float) -> None:
        raise NotImplementedError

    def observe(self, endpoint: str, outcome: OutcomeClass, now: float) -> None:
        """Attempt to ``endpoint`` ended with ``outcome`` (per-try timeouts included; cancelled attempts are
        not observed). For outlier detection; this base ignores it."""

    def alternative(self, endpoint: str, candidates: Sequence[str] | None) -> bool:
        """Is there an endpoint other than ``endpoint`` (among ``candidates``) that a retry could go to now?
        The base does not know: no."""
        return False

    def ready_at(self, now: float) -> float:
        """``pick`` found nothing for the first attempt or a retry: when to ask again (a replica set electing
        a primary will have one soon), or ``inf``: there will be none, the request ends ``no-endpoint``.
        The base: ``inf``."""
        return INF


class _Attempt:
    __slots__ = ("n", "endpoint", "expires", "whole", "done")

    def __init__(self, n: int, endpoint: str, expires: float, whole: bool) -> None:
        self.n = n
        self.endpoint = endpoint
        self.expires = expires  # per-try expiry; INF when the request deadline bounds it
        self.whole = whole
        self.done = False


class Call:
    """State of one request under a policy. See the module docstring for the protocol."""

    __slots__ = (
        "policy",
        "deadline",
        "own_deadline",
        "default_timeout",
        "complete",
        "complete_at_start",
        "picker",
        "throttle",
        "rand",
        "candidates",
        "retry_on",
        "max_attempts",
        "replayable",
        "hedging",
        "attempts",
        "inflight",
        "deprioritized",
        "backoff",
        "committed",
        "finished",
        "deliverable",
        "retry_at",
        "hedge_at",
        "stop_reason",
        "used_transparent",
        "free_attempt",
        "_wake",
    )

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        picker: EndpointPicker,
        rand: Rand,
        deadline: float = INF,
        default_timeout: float = INF,
        request_complete: bool = True,
        throttle: Throttle | None = None,
        candidates: Sequence[str] | None = None,
        retry_on: Collection[OutcomeClass] | None = None,
        max_attempts: int | None = None,
        replayable: bool = True,
    ) -> None:
        """``deadline``: the client's own deadline, absolute, on the clock of ``now`` (``inf``: the client
        sent none). ``default_timeout``: the sidecar's own bound when the client sent no deadline, in seconds;
        it counts from the moment the whole request has been received and handed upstream (Envoy's rule):
        ``Start`` when ``request_complete``, else the ``RequestComplete`` event. Until then, attempts run
        with no per-try timer either (an upload that is still flowing is never a timeout); the client's own
        deadline counts from arrival regardless (userver).
        ``retry_on`` narrows the policy's classes for this request (a POST may only retry
        ``connect-failure``); a narrowed request never hedges. ``max_attempts`` likewise caps the policy's.
        ``replayable=False``: the request cannot be sent twice (body larger than the replay buffer)."""
        self.policy = policy
        self.deadline = deadline
        self.own_deadline = not deadline < INF  # the client sent none: any deadline is the sidecar's bound
        self.default_timeout = default_timeout
        self.complete = False
        self.complete_at_start = request_complete
        self.picker = picker
        self.throttle = throttle
        self.rand = rand
        self.candidates = candidates
        narrowed = retry_on is not None
        self.retry_on = policy.retry_on if retry_on is None else frozenset(retry_on)
        hedging = policy.hedging if not narrowed else None
        self.hedging = hedging
        limit = hedging.max_attempts if hedging is not None else policy.max_attempts
        self.max_attempts = limit if max_attempts is None else min(limit, max_attempts)
        self.replayable = replayable
        self.attempts: list[_Attempt] = []
        self.inflight = 0
        self.deprioritized: set[str] | None = None  # made when an endpoint first answers overloaded
        self.backoff: BackoffSequence | None = None  # made on the first failure
        self.committed: int | None = None
        self.finished = False
        self.deliverable: tuple[int, Outcome] | None = None
        self.retry_at = INF  # retry mode: when the next attempt is due
        self.hedge_at = INF  # hedging mode: when the next hedge is due
        self.stop_reason: Reason | None = None  # hedging mode: why no more hedges will be sent
        self.used_transparent = False
        self.free_attempt = 0
        self._wake = INF

    # -- the one entry point ------------------------------------------------------------------------
    def handle(self, event: Event, now: float) -> list[Command]:
        out: list[Command] = []
        if self.finished:
            return out
        # isinstance narrows the type: compiled, the fields are then read from the struct, not looked up
        if isinstance(event, AttemptEnded):
            self._ended(event.attempt, event.outcome, now, out)
        elif isinstance(event, Tick):
            self._tick(now, out)
        elif isinstance(event, Start):
            self._start(now, out)
        elif isinstance(event, Committed):
            self._commit(event.attempt, out)
        elif isinstance(event, RequestComplete):
            self._complete(now)
        elif isinstance(event, BufferExceeded):
            self._buffer_exceeded(out)
        elif isinstance(event, ClientGone):
            self._finish(_REASON_CANCELLED, out, deliver=False)
        else:  # pragma: no cover - a programming error, not input
            raise TypeError(f"unknown event {event!r}")
        if not self.finished:
            self._schedule(out)
        return out

    def _backoff(self) -> BackoffSequence:
        b = self.backoff
        if b is None:
            b = self.backoff = BackoffSequence(self.policy.backoff)
        return b

    def holds_commit(self, n: int) -> bool:
        """Is attempt ``n`` the one whose response the client gets (after ``Committed``)?"""
        return self.committed == n and not self.finished

    def interrupt(self, reason: Reason) -> Finish:
        """The runtime ends the call for a cause the engine did not see (a bug outside it): no more commands;
        the runtime cancels what is in flight. The ``Finish`` it returns delivers nothing."""
        self.finished = True
        self.retry_at = self.hedge_at = INF
        return Finish(reason, None, None, len(self.attempts), self.own_deadline)

    # -- events ----------------------------------------------------------------------------------------
    def _start(self, now: float, out: list[Command]) -> None:
        if self.attempts:
            return
        if self.complete_at_start:
            self._complete(now)
        if now >= self.deadline:
            self._finish(_REASON_DEADLINE, out, deliver=False)
            return
        if not self._send(now, out, hedge=0):
            return
        if self.throttle is not None:
            self.throttle.on_request(now)  # a client request to the upstream (ratio retry budgets count it)
        h = self.hedging
        if h is not None and self.max_attempts > 1 and self.replayable:
            self.hedge_at = now + h.delay
            if h.delay <= 0:  # all copies at once
                self._hedges_due(now, out)

    def _tick(self, now: float, out: list[Command]) -> None:
        if now >= self.deadline:
            self._finish(_REASON_DEADLINE, out)
            return
        for a in list(self.attempts):
            if not a.done and a.expires <= now:
                out.append(CancelAttempt(a.n, _REASON_PER_TRY_TIMEOUT))
                self._ended(a.n, Outcome(C.TIMEOUT, detail="per-try timeout"), now, out)
                if self.finished:
                    return
        if self.retry_at <= now:
            self.retry_at = INF
            self._send(now, out, hedge=0)
        if self.hedge_at <= now:
            self._hedges_due(now, out)
            self._finish_if_idle(out)

    def _complete(self, now: float) -> None:
        """The whole request is upstream: the sidecar's own deadline and the per-try timers start now."""
        if self.complete:
            return
        self.complete = True
        if self.own_deadline and self.default_timeout < INF:
            self.deadline = now + self.default_timeout
        per_try = self.policy.per_try_timeout
        for a in self.attempts:
            if not a.done:
                a.expires = now + per_try if per_try < self.deadline - now else INF

    def _commit(self, n: int, out: list[Command]) -> None:
        if self.committed is not None or not (0 < n <= len(self.attempts)):
            return
        a = self.attempts[n - 1]
        if a.done:
            return
        self.committed = n
        self.retry_at = self.hedge_at = INF
        for other in self.attempts:
            if other is not a and not other.done:
                self._cancel(other, _REASON_HEDGE_LOST, out)

    def _buffer_exceeded(self, out: list[Command]) -> None:
        self.replayable = False
        self.hedge_at = INF
        if self.hedging is not None and self.stop_reason is None:
            self.stop_reason = _REASON_BUFFER_EXCEEDED
        if self.retry_at < INF:  # a retry was waiting: it can no longer be sent
            self.retry_at = INF
            self._finish(_REASON_BUFFER_EXCEEDED, out)
        elif self.hedging is not None:
            self._finish_if_idle(out)

    def _ended(self, n: int, outcome: Outcome, now: float, out: list[Command]) -> None:
        if not (0 < n <= len(self.attempts)):
            return
        a = self.attempts[n - 1]
        if a.done:  # a late result of an attempt already cancelled or timed out
            return
        a.done = True
        self.inflight -= 1
        picker = self.picker
        picker.finished(a.endpoint)
        policy = self.policy
        cls = outcome.cls
        if not outcome.local:  # the sidecar's own refusal says nothing of the endpoint's health
            picker.observe(a.endpoint, C.TIMEOUT if outcome.deadline_expired else cls, now)
        if cls is _CLS_SUCCESS:  # the common case, kept short
            self.deliverable = (n, outcome)
            if self.throttle is not None:
                self.throttle.on_success(n > 1 and n != self.free_attempt)
            out.append(Decision(n, a.endpoint, cls, _REASON_SUCCESS))
            self._finish(_REASON_SUCCESS, out)
            return
        upstream_deadline = False
        if outcome.deadline_expired:
            # userver: "deadline expired" from upstream is a timeout, never a body to pass on; when that
            # attempt had the request's whole remaining time, the request is over.
            if a.whole:
                upstream_deadline = True
            cls = C.TIMEOUT
        overloaded = cls is C.OVERLOADED or outcome.overload
        if overloaded:
            self.picker.penalize(a.endpoint, now)
            if policy.deprioritize_overloaded:
                if self.deprioritized is None:
                    self.deprioritized = set()
                self.deprioritized.add(a.endpoint)
        pushback = outcome.pushback if policy.pushback else None
        if outcome.backoff_base is not None and policy.pushback and outcome.backoff_base >= 0:
            self._backoff().rebase(outcome.backoff_base)
        if (
            not outcome.prefer_previous
            or self.deliverable is None
            or self.committed == n  # its response is already on its way to the client
        ):
            self.deliverable = (n, outcome)
        # A connect failure sent nothing: retried at once and for free, once, under A6's transparent retry
        # or when another endpoint can take it (a dead endpoint must not cost the retry budget).
        transparent = (
            cls is C.CONNECT_FAILURE
            and (policy.transparent_retry or self.picker.alternative(a.endpoint, self.candidates))
            and not self.used_transparent
            and self.hedging is None
            and self.committed is None
            and cls in self.retry_on
            and self.replayable
            and len(self.attempts) < self.max_attempts
            and now < self.deadline
            and not (pushback is not None and pushback.stop)
        )
        self._account(n, cls, pushback is not None and pushback.stop, transparent, overloaded)

        def decide(reason: Reason, delay: float = 0.0) -> None:
            out.append(Decision(n, a.endpoint, cls, reason, delay))

        if self.committed == n:
            decide(_REASON_COMMITTED)
            self._finish(_REASON_COMMITTED, out)
            return
        if upstream_deadline:
            decide(_REASON_DEADLINE)
            self._finish(_REASON_DEADLINE, out)
            return
        if self.hedging is not None:
            self._after_hedge(n, cls, pushback, now, out, decide)
        else:
            self._after_retry(cls, pushback, transparent, now, out, decide)

    # -- retry mode -----------------------------------------------------------------------------------
    def _after_retry(
        self,
        cls: OutcomeClass,
        pushback: Pushback | None,
        transparent: bool,
        now: float,
        out: list[Command],
        decide: Decide,
    ) -> None:
        if cls not in self.retry_on:
            return self._give_up(_REASON_NOT_RETRYABLE, out, decide)
        wait = pushback.delay if pushback is not None else None  # the server's wait (None: none, or stop)
        if pushback is not None and wait is None:
            return self._give_up(_REASON_PUSHBACK_NO_RETRY, out, decide)
        if not self.replayable:
            return self._give_up(_REASON_BUFFER_EXCEEDED, out, decide)
        if len(self.attempts) >= self.max_attempts:
            return self._give_up(_REASON_ATTEMPTS_EXHAUSTED, out, decide)
        if transparent:
            self.used_transparent = True
            decide(_REASON_TRANSPARENT_RETRY)
            self._send(now, out, hedge=0)
            self.free_attempt = len(self.attempts)  # not a paid retry: no token taken, none returned
            return None
        if wait is not None:
            delay = wait
            self._backoff().reset()
        elif cls in self.policy.backoff_on:
            delay = self._backoff().next(self.rand)
        else:
            delay = 0.0
        # A wait that would cross the deadline ends the request now, before a token is spent.
        if now + delay >= self.deadline:
            return self._give_up(_REASON_DEADLINE, out, decide)
        if self.throttle is not None and not self.throttle.acquire(now):
            return self._give_up(_REASON_THROTTLED, out, decide)
        decide(_REASON_RETRY, delay)
        if delay <= 0:
            self._send(now, out, hedge=0)
        else:
            self.retry_at = now + delay
        return None

    # -- hedging mode ---------------------------------------------------------------------------------
    def _after_hedge(
        self,
        n: int,
        cls: OutcomeClass,
        pushback: Pushback | None,
        now: float,
        out: list[Command],
        decide: Decide,
    ) -> None:
        assert self.hedging is not None
        if cls not in self.hedging.non_fatal:
            return self._give_up(_REASON_NOT_RETRYABLE, out, decide)
        if self.stop_reason is None:
            wait = pushback.delay if pushback is not None else None  # the server's wait (None: none, or stop)
            if pushback is not None and wait is None:
                self.stop_reason = _REASON_PUSHBACK_NO_RETRY
                self.hedge_at = INF
            elif len(self.attempts) >= self.max_attempts:
                self.stop_reason = _REASON_ATTEMPTS_EXHAUSTED
                self.hedge_at = INF
            elif wait is not None:
                # A6: the next hedge goes in n ms; later ones resume at n + hedging_delay.
                if now + wait >= self.deadline:
                    self.stop_reason = _REASON_DEADLINE
                    self.hedge_at = INF
                else:
                    self.hedge_at = now + wait
            else:
                self.hedge_at = now  # a non-fatal result sends the next hedge at once
        mark = len(out)
        sent_before = len(self.attempts)
        if self.hedge_at <= now:
            self._hedges_due(now, out)
        if len(self.attempts) > sent_before:
            reason = _REASON_HEDGE
        elif self.inflight > 0 or self.hedge_at < INF:
            reason = _REASON_AWAIT_HEDGES
        else:
            reason = self.stop_reason or _REASON_ATTEMPTS_EXHAUSTED
        out.insert(mark, Decision(n, self.attempts[n - 1].endpoint, cls, reason))
        if not self.finished and reason is not _REASON_HEDGE and reason is not _REASON_AWAIT_HEDGES:
            self._finish(reason, out)
        return None

    def _hedges_due(self, now: float, out: list[Command]) -> None:
        """Send the hedges that are due, while they may be sent; schedule the one after."""
        h = self.hedging
        assert h is not None
        while self.hedge_at <= now and not self.finished:
            self.hedge_at = INF
            if self.stop_reason is not None or self.committed is not None:
                return
            if len(self.attempts) >= self.max_attempts:
                self.stop_reason = _REASON_ATTEMPTS_EXHAUSTED
            elif now >= self.deadline:
                self.stop_reason = _REASON_DEADLINE
            elif not self.replayable:
                self.stop_reason = _REASON_BUFFER_EXCEEDED
            elif self.throttle is not None and not self.throttle.acquire(now):
                self.stop_reason = _REASON_THROTTLED
            elif (
                self._send(now, out, hedge=len(self.attempts))
                and len(self.attempts) < self.max_attempts
                and now + h.delay < self.deadline
            ):
                self.hedge_at = now + h.delay

    def _finish_if_idle(self, out: list[Command]) -> None:
        """Hedging: nothing is out and nothing more will go, so the last result is the answer."""
        if not self.finished and self.inflight == 0 and self.hedge_at == INF and self.retry_at == INF:
            self._finish(self.stop_reason or _REASON_ATTEMPTS_EXHAUSTED, out)

    # -- shared machinery -----------------------------------------------------------------------------
    def _send(self, now: float, out: list[Command], hedge: int) -> bool:
        tried = [a.endpoint for a in self.attempts] if self.attempts else ()
        endpoint = self.picker.pick(now, self.rand, self.candidates, tried, self.deprioritized or ())
        if endpoint is None:
            if hedge == 0:  # the first attempt or a retry: the picker may expect an endpoint soon
                later = self.picker.ready_at(now)
                if later < self.deadline:
                    self.retry_at = later  # ask again then (the wait is the engine's, on its own timer)
                    return False
                if later < INF:  # a wait for an endpoint that would cross the deadline ends the request now
                    self._finish(_REASON_DEADLINE, out)
                    return False
            self._finish(_REASON_NO_ENDPOINT, out)
            return False
        remaining = self.deadline - now
        per_try = self.policy.per_try_timeout
        if per_try < remaining and self.complete:
            timeout, whole, expires = per_try, False, now + per_try
        else:  # the whole remaining deadline (while the request is still arriving: no per-try timer yet)
            timeout, whole, expires = remaining, True, INF
        n = len(self.attempts) + 1
        self.attempts.append(_Attempt(n, endpoint, expires, whole))
        self.inflight += 1
        self.picker.started(endpoint)
        out.append(SendAttempt(n, endpoint, timeout, whole, hedge))
        return True

    def _account(
        self, n: int, cls: OutcomeClass, pushback_stop: bool, transparent: bool, overloaded: bool
    ) -> None:
        throttle = self.throttle
        if throttle is None:
            return
        retry = n > 1 and n != self.free_attempt
        if cls is C.SUCCESS:
            throttle.on_success(retry)
            return
        failed_class = self.hedging.non_fatal if self.hedging is not None else self.policy.retry_on
        counted = (cls in failed_class or pushback_stop) and not transparent
        throttle.on_failure(retry, counted, overloaded)

    def _cancel(self, a: _Attempt, reason: Reason, out: list[Command]) -> None:
        a.done = True
        self.inflight -= 1
        self.picker.finished(a.endpoint)
        out.append(CancelAttempt(a.n, reason))

    def _give_up(self, reason: Reason, out: list[Command], decide: Decide) -> None:
        decide(reason)
        self._finish(reason, out)

    def _finish(self, reason: Reason, out: list[Command], deliver: bool = True) -> None:
        # Attempts still out lost the race (success, fatal answer) or are cut short by ``reason``.
        cancel_reason = _REASON_HEDGE_LOST if reason in _WON else reason
        for a in self.attempts:
            if not a.done:
                self._cancel(a, cancel_reason, out)
        attempt: int | None = None
        outcome: Outcome | None = None
        if deliver and self.deliverable is not None:
            attempt, outcome = self.deliverable
        self.finished = True
        self.retry_at = self.hedge_at = INF
        out.append(Finish(reason, attempt, outcome, len(self.attempts), self.own_deadline))

    def _schedule(self, out: list[Command]) -> None:
        at = self.deadline
        if self.retry_at < at:
            at = self.retry_at
        if self.hedge_at < at:
            at = self.hedge_at
        for a in self.attempts:
            if not a.done and a.expires < at:
                at = a.expires
        if at != self._wake:
            self._wake = at
            out.append(Wake(at))
