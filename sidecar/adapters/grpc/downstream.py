"""The client's side of a proxied call: the one owner of its outgoing operations.

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
from typing import Any

import grpc

from ...policy import Call
from ...runtime import AttemptContext
from .metadata import response_metadata, with_previous_attempts
from .request import RequestStream


class CallClosed(Exception):
    """An outgoing operation after the call's answer was decided: refused, never sent."""


class Downstream:
    """The client's call: which attempt owns it, and its headers and messages, sent one at a time."""

    __slots__ = ("context", "call", "owner", "stream", "headers_sent", "closed", "_inflight")

    def __init__(self, context: grpc.aio.ServicerContext, call: Call, stream: RequestStream | None) -> None:
        self.context = context
        self.call = call
        self.stream = stream
        self.owner: int | None = None
        self.headers_sent = False
        self.closed = False
        self._inflight: asyncio.Future[None] | None = None

    def claim(self, ctx: AttemptContext) -> bool:
        """Make this attempt the one whose response the client gets; False if another got there first."""
        n = ctx.attempt.attempt
        if self.owner is None and not self.closed:
            ctx.commit()
            if self.call.committed == n:
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
