"""The client's side of a proxied call: the one owner of what goes to the client, and when.

grpc core allows one operation of each kind in flight on a call, and the server sends the call's status
(with the response headers, if none went out yet) when the handler returns. An attempt that is cancelled
while its write is in flight (the deadline fired, a per-try timeout ended the committed attempt) leaves the
core operation running; if the handler then returned, grpc would send the status, and headers a second
time, beside it: ``GRPC_CALL_ERROR_TOO_MANY_OPERATIONS``, no status, a client left waiting.

So every outgoing operation goes through :class:`Downstream`, one at a time, each in a task of its own that
cancelling the attempt does not abandon half-way; :meth:`Downstream.close` refuses any further one and waits
for the one in flight to settle, and only then is the status set (:meth:`Downstream.deliver`) and the
handler returns. Which attempt may send is decided once (``claim``): the first to have something for the
client, once the engine gave it A6's commit. What is sent is ``answer.py``'s to say; this module only writes it.

Its life is one explicit :class:`State`, changed only by its own methods; a step it does not have raises
:class:`~sidecar.adapters.transitions.InvalidTransition` (a bug)::

    OPEN ──claim──► CLAIMED ──send_headers──► SENDING ──write──► SENDING
      │               │                         │
      └───────────────┴────────close────────────┴──► CLOSED ──deliver──► ANSWERED
      └──────────────────────────deliver (refused at the door: nothing was sent)───► ANSWERED
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from enum import IntEnum
from typing import Any

import grpc

from ...admission.refusal import Refusal
from ...telemetry import RequestObserver
from ..transitions import InvalidTransition
from .answer import Answer, refused, response_headers
from .classify import CODE_NUMBER

log = logging.getLogger("sidecar.grpc")


class State(IntEnum):
    OPEN = 0  # no attempt owns the response yet (a retry or a hedge may still be sent)
    CLAIMED = 1  # an attempt owns it (A6's commit); nothing went out yet
    SENDING = 2  # the owner's headers went out (or go with its first message): its messages follow
    CLOSED = 3  # the call's answer is decided: no further operation; the one in flight has settled
    ANSWERED = 4  # the status is set: grpc sends it when the handler returns


class CallClosed(Exception):
    """An outgoing operation after the call's answer was decided: refused, never sent."""


class Downstream:
    """The client's call: which attempt owns it, and its headers, messages and status, sent one at a time.
    Also the call's :class:`~sidecar.admit.Refuser`: a call refused at the door is answered here."""

    __slots__ = ("context", "state", "owner", "_inflight")

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self.context = context
        self.state = State.OPEN
        self.owner = 0  # the attempt that owns the response (0: none)
        self._inflight: asyncio.Future[None] | None = None

    def _invalid(self, event: str) -> InvalidTransition:
        return InvalidTransition("grpc downstream", self.state.name.lower(), event)

    def claim(self, attempt: int) -> bool:
        """Make attempt ``attempt`` (which holds the engine's commit) the one whose response the client gets;
        False if another got there first (or the call's answer is decided)."""
        if self.state is State.OPEN:
            self.owner = attempt
            self.state = State.CLAIMED
            return True
        return self.owner == attempt and self.state is not State.CLOSED and self.state is not State.ANSWERED

    async def send_headers(self, initial: Any, attempt: int) -> None:
        """The owner's response headers, as the client gets them (``answer.response_headers``)."""
        if self.state is not State.CLAIMED or attempt != self.owner:
            if self.state is State.CLOSED:
                raise CallClosed("the call's answer is already decided")
            raise self._invalid("send_headers")
        self.state = State.SENDING
        md = response_headers(initial, attempt)
        if md:  # empty headers go out with the first message by themselves (one write fewer)
            await self._send(self.context.send_initial_metadata(md))

    async def write(self, message: bytes) -> None:
        if self.state is not State.SENDING:
            if self.state is State.CLOSED:
                raise CallClosed("the call's answer is already decided")
            raise self._invalid("write")
        await self._send(self.context.write(message))

    async def _send(self, op: Coroutine[Any, Any, None]) -> None:
        if self.state is State.CLOSED:  # closed while an earlier operation was awaited
            op.close()
            raise CallClosed("the call's answer is already decided")
        previous = self._inflight
        if previous is not None and not previous.done():  # (the owner sends in order: only after a cancel)
            await asyncio.wait((previous,))
        fut = self._inflight = asyncio.get_running_loop().create_task(op)
        await asyncio.shield(fut)  # cancelled, the caller stops waiting; the operation itself runs on

    async def close(self) -> None:
        """No outgoing operation after this one; wait for the one in flight (its failure is the caller's)."""
        if self.state is State.ANSWERED:
            raise self._invalid("close")
        self.state = State.CLOSED
        fut, self._inflight = self._inflight, None
        if fut is not None:
            if not fut.done():
                await asyncio.wait((fut,))
            if not fut.cancelled():
                fut.exception()  # retrieved: its caller was told, or was cancelled and does not care

    def deliver(self, ans: Answer, obs: RequestObserver, end: bool = True) -> None:
        """Set the call's status (grpc sends it when the handler returns); the span records it (and ends,
        unless ``end`` is False: its owner ends it)."""
        if self.state is not State.CLOSED and self.state is not State.OPEN:
            raise self._invalid("deliver")
        self.state = State.ANSWERED
        try:
            self.context.set_trailing_metadata(tuple(ans.trailing))
            self.context.set_code(ans.code)
            if ans.details:
                self.context.set_details(ans.details)
        except Exception as e:  # noqa: BLE001 - a server call that already ended refuses them
            log.debug("the client is gone before its status: %r", e)
        obs.set_attribute("rpc.grpc.status_code", CODE_NUMBER[ans.code])
        if end:
            obs.end(None if ans.code is grpc.StatusCode.OK else ans.code.name)

    def refused(self, refusal: Refusal, obs: RequestObserver) -> None:
        """Refused at the door (an ``admit.Refuser``): ``RESOURCE_EXHAUSTED`` and when to come back."""
        self.deliver(refused(refusal), obs, end=False)
