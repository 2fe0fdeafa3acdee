"""The one answer the client gets for each way a call can end (STYLE habit 10).

| Finish reason | with an upstream status | without one |
| --- | --- | --- |
| ``success``, ``not-retryable``, ``committed`` | the upstream's status, details and trailers | — |
| ``attempts-exhausted``, ``throttled``, ``pushback-no-retry``, ``buffer-exceeded`` | the last upstream status, plus ``grpc-retry-pushback-ms: -1`` (``give_up_pushback``) | ``DEADLINE_EXCEEDED`` if the last attempt hit its per-try timeout |
| ``deadline``, the client's deadline (or the service config's timeout) | ``DEADLINE_EXCEEDED`` "Deadline propagation: Not enough time to handle this call" | same |
| ``deadline``, the sidecar's own bound (the client set none) | the last upstream status, as for a give-up | ``DEADLINE_EXCEEDED`` |
| ``internal-error`` (a sidecar bug, logged) | — | ``INTERNAL`` |
| ``no-endpoint`` | — | ``UNAVAILABLE`` naming the upstream |
| ``cancelled`` | — | ``CANCELLED`` (the client is gone; nobody reads it) |

Every answer after more than one attempt carries ``grpc-previous-rpc-attempts`` in its trailers.

A call admission refuses (:func:`refused`, issue 12: the listener's request rate, or an endpoint's ticket
queue) ends with ``RESOURCE_EXHAUSTED``, details naming the limiter, and ``grpc-retry-pushback-ms`` set to
the wait for the next token (A6: a client that retries ``RESOURCE_EXHAUSTED`` waits that long; ``0`` when
the wait is not known).

What goes to the client, and when (:class:`Downstream`). The client's side of a proxied call: the one owner of its outgoing operations.

grpc core allows one operation of each kind in flight on a call, and the server sends the call's status
(with the response headers, if none went out yet) when the handler returns. An attempt that is cancelled
while its write is in flight (the deadline fired, a per-try timeout ended the committed attempt) leaves the
core operation running; if the handler then returned, grpc would send the status, and headers a second
time, beside it: ``GRPC_CALL_ERROR_TOO_MANY_OPERATIONS``, no status, a client left waiting.

So every outgoing operation goes through :class:`Downstream`, one at a time, each in a task of its own that
cancelling the attempt does not abandon half-way; :meth:`Downstream.close` refuses any further one and waits
for the one in flight to settle, and only then may the handler set the status and return. Which attempt may
send is decided once (``claim``): the first to have something for the client, as A6's commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import grpc

from ...admission.refusal import Refusal
from ...policy import Finish, OutcomeClass, Reason
from ...runtime import AttemptContext
from .metadata import PUSHBACK, response_metadata, with_give_up_pushback, with_previous_attempts
from .replay import RequestStream

DEADLINE_DETAILS = "Deadline propagation: Not enough time to handle this call"
_GIVE_UPS = frozenset(
    {
        Reason.ATTEMPTS_EXHAUSTED,
        Reason.THROTTLED,
        Reason.PUSHBACK_NO_RETRY,
        Reason.BUFFER_EXCEEDED,
        Reason.COMMITTED,
        Reason.NO_ENDPOINT,
        Reason.DEADLINE,
    }
)


@dataclass(frozen=True, slots=True)
class UpstreamStatus:
    """How one attempt ended at the upstream: the attempter's payload."""

    code: grpc.StatusCode
    details: str
    trailing: tuple[tuple[str, str | bytes], ...] = ()
    initial: tuple[tuple[str, str | bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class Answer:
    code: grpc.StatusCode
    details: str
    trailing: list[tuple[str, str | bytes]] = field(default_factory=list)


def answer(finish: Finish, status: UpstreamStatus | None, *, upstream: str, give_up_pushback: bool) -> Answer:
    reason = finish.reason
    previous = finish.attempt - 1 if status is not None and finish.attempt else finish.attempts
    if reason is Reason.DEADLINE and not (finish.own_deadline and status is not None):
        code, details, trailing = grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_DETAILS, []
    elif reason is Reason.INTERNAL:
        code, details, trailing = grpc.StatusCode.INTERNAL, "sidecar: internal error (logged)", []
    elif status is not None:
        code, details, trailing = status.code, status.details, response_metadata(status.trailing)
    elif reason is Reason.NO_ENDPOINT:
        code, details, trailing = (
            grpc.StatusCode.UNAVAILABLE,
            f"sidecar: upstream {upstream!r} has no endpoint",
            [],
        )
    elif reason is Reason.CANCELLED:
        code, details, trailing = grpc.StatusCode.CANCELLED, "sidecar: the call was cancelled", []
    elif finish.outcome is not None and finish.outcome.cls is OutcomeClass.TIMEOUT:
        code, details = (
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"sidecar: attempt {finish.attempt} hit its per-try timeout",
        )
        trailing = []
    else:  # an attempt that ended without a status to show (it was abandoned)
        what = finish.outcome.cls.value if finish.outcome is not None else "no answer"
        code, details, trailing = grpc.StatusCode.UNAVAILABLE, f"sidecar: {reason.value} ({what})", []
    if give_up_pushback and reason in _GIVE_UPS and code is not grpc.StatusCode.OK:
        trailing = with_give_up_pushback(trailing)
    return Answer(code, details, with_previous_attempts(trailing, previous))


def refused(refusal: Refusal, previous: int = 0) -> Answer:
    """What a call refused by admission ends with: ``RESOURCE_EXHAUSTED`` and when to come back.
    ``previous``: attempts made before the refused one (an endpoint's ticket refused on a retry), told in
    ``grpc-previous-rpc-attempts`` as for every answer after more than one attempt."""
    return Answer(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"retry-sidecar: {refusal.message}",
        with_previous_attempts([(PUSHBACK, str(refusal.retry_after_ms))], previous),
    )


# -- the client's side of the call ----------------------------------------------------------------------
class CallClosed(Exception):
    """An outgoing operation after the call's answer was decided: refused, never sent."""


class Downstream:
    """The client's call: which attempt owns it, and its headers and messages, sent one at a time."""

    __slots__ = ("context", "owner", "stream", "headers_sent", "closed", "_inflight")

    def __init__(self, context: grpc.aio.ServicerContext, stream: RequestStream | None) -> None:
        self.context = context
        self.stream = stream
        self.owner: int | None = None
        self.headers_sent = False
        self.closed = False
        self._inflight: asyncio.Future[None] | None = None

    def claim(self, ctx: AttemptContext) -> bool:
        """Make this attempt the one whose response the client gets; False if another got there first."""
        n = ctx.attempt.attempt
        if self.owner is None and not self.closed and ctx.commit():
            self.owner = n
            if self.stream is not None:
                self.stream.seal()
        return self.owner == n

    async def send_headers(self, initial: Any, attempt: int) -> None:
        if not self.headers_sent:
            self.headers_sent = True
            md = with_previous_attempts(response_metadata(initial or ()), attempt - 1)
            if md:  # empty headers go out with the first message by themselves (one write fewer)
                await self._send(self.context.send_initial_metadata(tuple(md)))

    async def write(self, message: bytes) -> None:
        await self._send(self.context.write(message))

    async def _send(self, op: Coroutine[Any, Any, None]) -> None:
        if self.closed:
            op.close()
            raise CallClosed("the call's answer is already decided")
        previous = self._inflight
        if previous is not None and not previous.done():  # (the owner sends in order: only after a cancel)
            await asyncio.wait((previous,))
        fut = self._inflight = asyncio.ensure_future(op)
        await asyncio.shield(fut)  # cancelled, the caller stops waiting; the operation itself runs on

    async def close(self) -> None:
        """No outgoing operation after this one; wait for the one in flight (its failure is the caller's)."""
        self.closed = True
        fut, self._inflight = self._inflight, None
        if fut is not None:
            if not fut.done():
                await asyncio.wait((fut,))
            if not fut.cancelled():
                fut.exception()  # retrieved: its caller was told, or was cancelled and does not care
