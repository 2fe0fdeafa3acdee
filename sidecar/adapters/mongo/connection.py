"""One app connection: frames messages off the socket, hands them one at a time to the listener, writes the
answers back; and when the app goes away mid-request, cancels that request (its attempts stop: the engine
sees the client gone).

A protocol rather than streams so that a closed connection is noticed while a request is out (a stream
reader only learns of it on the next read). Messages the app sends ahead are queued (at most
``_QUEUE_LIMIT``, then reading pauses). A message that cannot be framed (length below 16 or above the
listener's limit) closes the connection with a log line; so does any :class:`wire.ProtocolError` raised
while handling one.

Every message is reserved whole in the process-wide :class:`BufferBudget` as soon as its header tells its
length, and released once it was answered: when the reservation does not fit, reading stops until it does
(and ``message_timeout`` closes a connection that waits too long), so many large messages at once cannot
take the process past ``limits.max_buffered_bytes``.

Two timers (:class:`Limits`): a connection with nothing in progress (no request, no partial message) for
``idle_timeout`` is closed quietly, as a driver's pool expects of a server; a message whose first bytes
arrived must be complete within ``message_timeout``, else the connection is closed with a log line naming
the peer (a stalled or trickling client would otherwise hold its buffer forever).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from ...buffer_budget import BufferBudget
from ..connections import Connections
from . import wire
from .commands import CommandError
from .patch import PatchError

log = logging.getLogger("sidecar.mongo")

#: (connection id, the app's address, header, payload) -> the reply to write (``None``: none)
Handler = Callable[[int, str, wire.Header, bytes], Awaitable[bytes | None]]
_QUEUE_LIMIT = 16
_BAD_INPUT = (wire.ProtocolError, CommandError, PatchError)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one app connection may hold, from its listener's config when it was accepted."""

    max_size: int
    idle_timeout: float
    message_timeout: float


class AppConnection(asyncio.Protocol):
    def __init__(
        self,
        conn_id: int,
        handler: Handler,
        limits: Limits,
        listener: str,
        connections: Connections[AppConnection],
        budget: BufferBudget,
        on_closed: Callable[[], None] = lambda: None,
    ) -> None:
        self.conn_id = conn_id
        self.handler = handler
        self.limits = limits
        self.max_size = limits.max_size
        self.listener = listener
        self.connections = connections
        self.on_closed = on_closed  # the listener may accept another connection
        self.budget = budget
        self.reserved = 0  # bytes reserved for the message being read
        self.held = 0  # bytes reserved for messages read and not yet answered
        self.ticket: int | None = None  # waiting for room in the budget
        self.starved = False  # reading stopped until the budget has room
        self.reading_paused = False
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.host = ""  # the app's IP address (admission's exempt_cidrs)
        self.buffer = bytearray()
        self.queue: collections.deque[tuple[wire.Header, bytes]] = collections.deque()
        self.wakeup: asyncio.Future[None] | None = None
        self.writable: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.busy = False
        self.closed = False
        self.closing = False  # close once the answer in progress is out (a drain)
        self.paused = False
        self.idle_timer: asyncio.TimerHandle | None = None
        self.message_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.peer = f"{peer[0]}:{peer[1]}"
            self.host = str(peer[0])
        self.connections.add(self)
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"mongo-app {self.peer}")

    def data_received(self, data: bytes) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        self.buffer += data
        self._frame()

    def _frame(self) -> None:
        buf = self.buffer
        framed = False
        while len(buf) >= wire.HEADER_SIZE and not self.closed:
            try:
                header = wire.parse_header(buf, self.max_size)
            except wire.ProtocolError as e:
                self.refuse(e)
                return
            if self.reserved < header.length and not self._reserve(header.length):
                break
            if len(buf) < header.length:
                break
            payload = bytes(buf[wire.HEADER_SIZE : header.length])
            del buf[: header.length]
            self.queue.append((header, payload))
            self.held += self.reserved
            self.reserved = 0
            framed = True
        if framed and self.message_timer is not None:
            self.message_timer.cancel()
            self.message_timer = None
        if buf and self.message_timer is None and not self.closed:
            self.message_timer = asyncio.get_running_loop().call_later(
                self.limits.message_timeout, self._message_expired
            )
        if len(self.queue) >= _QUEUE_LIMIT and not self.paused:
            self.paused = True
            self._reading()
        self._wake()

    def _reserve(self, n: int) -> bool:
        """Reserve the message's ``n`` bytes; when they do not fit, stop reading until they do."""
        if self.ticket is not None:
            return False
        if self.budget.reserve(n):
            self.reserved = n
            return True
        self.starved = True
        self.ticket = -1  # wait() may grant at once
        ticket = self.budget.wait(n, lambda: self._granted(n))
        if self.ticket is None:
            return True
        self.ticket = ticket
        self._reading()
        return False

    def _granted(self, n: int) -> None:
        self.ticket = None
        self.starved = False
        if self.closed:
            self.budget.release(n)
            return
        self.reserved = n
        self._reading()
        if self.transport is not None:
            self._frame()

    def _reading(self) -> None:
        want = self.paused or self.starved
        if want != self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = want
            if want:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def _answered(self, n: int) -> None:
        if self.held >= n:
            self.held -= n
            self.budget.release(n)

    def eof_received(self) -> bool:
        if self.buffer:
            log.warning(
                "mongodb listener %s: the connection from %s closed in the middle of a message",
                self.listener,
                self.peer,
            )
        return False  # close: drivers never half-close and wait for an answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.connections.discard(self)
        self.on_closed()
        if self.ticket is not None and self.ticket >= 0:
            self.budget.cancel(self.ticket)
        self.ticket = None
        held, self.held, self.reserved = self.held + self.reserved, 0, 0
        if held:
            self.budget.release(held)
        for timer in (self.idle_timer, self.message_timer):
            if timer is not None:
                timer.cancel()
        if self.busy and self.task is not None:
            self.task.cancel()  # the app is gone: stop the request's attempts
        self._wake()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def pause_writing(self) -> None:
        self.writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    # -- the requests, in order ------------------------------------------------------------------------
    def _wake(self) -> None:
        if self.wakeup is not None and not self.wakeup.done():
            self.wakeup.set_result(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                while not self.queue:
                    if self.closed:
                        return
                    if not self.buffer and self.idle_timer is None:
                        self.idle_timer = loop.call_later(self.limits.idle_timeout, self._idle_expired)
                    self.wakeup = loop.create_future()
                    await self.wakeup
                    self.wakeup = None
                header, payload = self.queue.popleft()
                if self.paused and len(self.queue) < _QUEUE_LIMIT // 2:
                    self.paused = False
                    self._reading()
                self.busy = True
                try:
                    out = await self.handler(self.conn_id, self.host, header, payload)
                finally:
                    self.busy = False
                    del payload
                    self._answered(header.length)
                if out and not self.closed and self.transport is not None:
                    self.transport.write(out)
                    if self.writable is not None:
                        await self.writable
                if self.closing:
                    self.close()
                self.connections.idle(self)
        except _BAD_INPUT as e:
            self.refuse(e)
        except asyncio.CancelledError:
            if not self.closed:
                raise
        except Exception:  # a bug of ours: this connection ends, the listener goes on
            log.exception(
                "mongodb listener %s: internal error on the connection from %s", self.listener, self.peer
            )
            self.close()

    def _idle_expired(self) -> None:
        self.idle_timer = None
        if not self.busy and not self.queue and not self.buffer:
            log.debug(
                "mongodb listener %s: closing the connection from %s: idle for %gs",
                self.listener,
                self.peer,
                self.limits.idle_timeout,
            )
            self.close()

    def _message_expired(self) -> None:
        self.message_timer = None
        if not self.buffer:
            return
        size = int.from_bytes(self.buffer[:4], "little") if len(self.buffer) >= 4 else None
        log.warning(
            "mongodb listener %s: closing the connection from %s: a message it began %gs ago is still "
            "incomplete (%d of %s bytes; message_timeout)",
            self.listener,
            self.peer,
            self.limits.message_timeout,
            len(self.buffer),
            size if size is not None else "?",
        )
        self.queue.clear()
        self.buffer.clear()
        self.close()

    def refuse(self, reason: Exception) -> None:
        log.warning(
            "mongodb listener %s: closing the connection from %s: %s", self.listener, self.peer, reason
        )
        self.queue.clear()
        self.buffer.clear()
        self.close()

    def close_after_answer(self) -> None:
        self.closing = True

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def drop(self) -> None:
        if self.transport is not None:
            self.transport.abort()
