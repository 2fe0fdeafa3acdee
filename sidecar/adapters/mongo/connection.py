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

The connection's life is one explicit :class:`AppState` (h11-style): what it is doing with messages
(:class:`Phase`) and whether the socket is read (:class:`Intake`); only the connection changes it, through
the state's own transitions, and a transition the machine does not have raises ``InvalidTransition``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from enum import IntEnum

from ...buffer_budget import BufferBudget
from ..connections import Connections
from ..transitions import InvalidTransition
from . import wire
from .commands import CommandError
from .login import Login
from .patch import PatchError

log = logging.getLogger("sidecar.mongo")

#: (the connection, header, payload) -> the reply to write (``None``: none)
Handler = Callable[["AppConnection", wire.Header, bytes], Awaitable[bytes | None]]
_QUEUE_LIMIT = 16
_BAD_INPUT = (wire.ProtocolError, CommandError, PatchError)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one app connection may hold, from its listener's config when it was accepted."""

    max_size: int
    idle_timeout: float
    message_timeout: float


class Phase(IntEnum):
    """What an app connection is doing with the app's messages::

    IDLE ──begin──► BUSY ──answered──► IDLE
      │               └──finish──► LAST ──answered──► CLOSING
      └──finish──────────────────────────────────────► CLOSING
    CLOSED   (lost: from any state; an answer still winding down then ends quietly)
    """

    IDLE = 0  # open; no message being answered
    BUSY = 1  # a message is being answered
    LAST = 2  # a message is being answered, and the connection closes once it is out (a drain)
    CLOSING = 3  # nothing in progress, no message taken any more: the transport is being closed
    CLOSED = 4  # the transport is gone


class Intake(IntEnum):
    """Whether the connection reads its socket::

    READING ──fill──► FULL ──drained──► READING
       │                └─starve─┐
       └──starve──► STARVED ◄────┘ ──granted──► READING or FULL
    """

    READING = 0
    FULL = 1  # ``_QUEUE_LIMIT`` messages wait: reading stops until half of them are answered
    STARVED = 2  # a message's bytes do not fit the buffer budget: reading stops until they are reserved


class AppState:
    """One app connection's state; :class:`AppConnection` is its only owner. ``ticket``: the buffer
    budget's ticket while STARVED (``None`` until the budget gave one)."""

    __slots__ = ("phase", "intake", "ticket")

    def __init__(self) -> None:
        self.phase = Phase.IDLE
        self.intake = Intake.READING
        self.ticket: int | None = None

    @property
    def busy(self) -> bool:
        return self.phase is Phase.BUSY or self.phase is Phase.LAST

    @property
    def closed(self) -> bool:
        return self.phase is Phase.CLOSED

    @property
    def paused(self) -> bool:
        """Reading stopped (queue full or budget starved)."""
        return self.intake is not Intake.READING

    def _refuse(self, event: str, state: IntEnum) -> InvalidTransition:
        return InvalidTransition("mongodb app connection", state.name.lower(), event)

    # -- the messages --------------------------------------------------------------------------------
    def begin(self) -> None:
        """A message is taken to be answered."""
        if self.phase is not Phase.IDLE:
            raise self._refuse("begin", self.phase)
        self.phase = Phase.BUSY

    def answered(self) -> Phase:
        """The message in progress was answered (or cut short): the phase now (CLOSING: close the
        transport)."""
        if self.phase is Phase.BUSY:
            self.phase = Phase.IDLE
        elif self.phase is Phase.LAST:
            self.phase = Phase.CLOSING
        elif self.phase is not Phase.CLOSED:
            raise self._refuse("answered", self.phase)
        return self.phase

    def finish(self) -> None:
        """Take no new message; close once the one in progress, if any, is answered."""
        if self.phase is Phase.IDLE:
            self.phase = Phase.CLOSING
        elif self.phase is Phase.BUSY:
            self.phase = Phase.LAST

    def lost(self) -> int | None:
        """The transport is gone; the budget ticket to cancel, if reading waited for one."""
        if self.phase is Phase.CLOSED:
            raise self._refuse("lost", self.phase)
        self.phase = Phase.CLOSED
        ticket, self.ticket = self.ticket, None
        return ticket

    # -- reading -------------------------------------------------------------------------------------
    def fill(self) -> None:
        """The queue reached its limit."""
        if self.intake is not Intake.READING:
            raise self._refuse("fill", self.intake)
        self.intake = Intake.FULL

    def drained(self) -> None:
        """The queue fell to half its limit."""
        if self.intake is not Intake.FULL:
            raise self._refuse("drained", self.intake)
        self.intake = Intake.READING

    def starve(self) -> None:
        """A message's reservation did not fit the budget: reading waits for it."""
        if self.intake is Intake.STARVED:
            raise self._refuse("starve", self.intake)
        self.intake = Intake.STARVED

    def waiting(self, ticket: int) -> None:
        """The budget's ticket for the wait (unless it granted at once)."""
        if self.intake is Intake.STARVED and self.phase is not Phase.CLOSED:
            self.ticket = ticket

    def granted(self, full: bool) -> None:
        """The budget reserved the message's bytes; ``full``: the queue is still at its limit."""
        if self.intake is not Intake.STARVED:
            raise self._refuse("granted", self.intake)
        self.intake = Intake.FULL if full else Intake.READING
        self.ticket = None


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
        login: Login | None = None,
    ) -> None:
        self.conn_id = conn_id
        self.login = login  # the app's own login (app_auth), driven by the listener
        self.handler = handler
        self.limits = limits
        self.max_size = limits.max_size
        self.listener = listener
        self.connections = connections
        self.on_closed = on_closed  # the listener may accept another connection
        self.budget = budget
        self.state = AppState()
        self.reserved = 0  # bytes reserved for the message being read
        self.held = 0  # bytes reserved for messages read and not yet answered
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.host = ""  # the app's IP address (admission's exempt_cidrs)
        self.buffer = bytearray()
        self.queue: collections.deque[tuple[wire.Header, bytes]] = collections.deque()
        self.wakeup: asyncio.Future[None] | None = None
        self.writable: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        self.message_timer: asyncio.TimerHandle | None = None

    @property
    def busy(self) -> bool:
        return self.state.busy

    @property
    def closed(self) -> bool:
        return self.state.closed

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
        state = self.state
        framed = False
        while len(buf) >= wire.HEADER_SIZE and not state.closed:
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
        if buf and self.message_timer is None and not state.closed:
            self.message_timer = asyncio.get_running_loop().call_later(
                self.limits.message_timeout, self._message_expired
            )
        if len(self.queue) >= _QUEUE_LIMIT and state.intake is Intake.READING:
            self._pause(state.fill)
        self._wake()

    def _reserve(self, n: int) -> bool:
        """Reserve the message's ``n`` bytes; when they do not fit, stop reading until they do."""
        state = self.state
        if state.intake is Intake.STARVED:
            return False
        if self.budget.reserve(n):
            self.reserved = n
            return True
        self._pause(state.starve)
        state.waiting(self.budget.wait(n, lambda: self._granted(n)))
        return state.intake is not Intake.STARVED  # granted at once

    def _granted(self, n: int) -> None:
        state = self.state
        if state.closed:
            self.budget.release(n)
            return
        self.reserved = n
        self._pause(lambda: state.granted(len(self.queue) >= _QUEUE_LIMIT))
        if self.transport is not None:
            self._frame()

    def _pause(self, transition: Callable[[], None]) -> None:
        """Carry out an intake transition, pausing or resuming the transport when reading changes."""
        state = self.state
        before = state.paused
        transition()
        if state.paused != before and self.transport is not None and not state.closed:
            if state.paused:
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
        busy = self.state.busy
        ticket = self.state.lost()
        self.connections.discard(self)
        self.on_closed()
        if ticket is not None:
            self.budget.cancel(ticket)
        held, self.held, self.reserved = self.held + self.reserved, 0, 0
        if held:
            self.budget.release(held)
        for timer in (self.idle_timer, self.message_timer):
            if timer is not None:
                timer.cancel()
        if busy and self.task is not None:
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
        state = self.state
        try:
            while True:
                while not self.queue or state.phase is not Phase.IDLE:
                    if state.phase is Phase.CLOSED or state.phase is Phase.CLOSING:
                        return
                    if not self.buffer and self.idle_timer is None:
                        self.idle_timer = loop.call_later(self.limits.idle_timeout, self._idle_expired)
                    self.wakeup = loop.create_future()
                    await self.wakeup
                    self.wakeup = None
                header, payload = self.queue.popleft()
                if state.intake is Intake.FULL and len(self.queue) < _QUEUE_LIMIT // 2:
                    self._pause(state.drained)
                state.begin()
                try:
                    out = await self.handler(self, header, payload)
                finally:
                    phase = state.answered()
                    del payload
                    self._answered(header.length)
                if out and not state.closed and self.transport is not None:
                    self.transport.write(out)
                    if self.writable is not None:
                        await self.writable
                if phase is Phase.CLOSING:
                    self.close()
                self.connections.idle(self)
        except _BAD_INPUT as e:
            self.refuse(e)
        except asyncio.CancelledError:
            if not state.closed:
                raise
        except Exception:  # a bug of ours: this connection ends, the listener goes on
            log.exception(
                "mongodb listener %s: internal error on the connection from %s", self.listener, self.peer
            )
            self.close()

    def _idle_expired(self) -> None:
        self.idle_timer = None
        if not self.state.busy and not self.queue and not self.buffer:
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
        self.state.finish()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def drop(self) -> None:
        if self.transport is not None:
            self.transport.abort()
