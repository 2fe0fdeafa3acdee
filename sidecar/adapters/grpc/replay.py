"""The client's request messages: forwarded as they arrive, kept for replay (A6 "buffered RPCs").

Every call, whatever its shape, is forwarded as a stream: each attempt's writer sends what the
:class:`RequestStream` holds, then follows live messages, then half-closes once the client did. The client
is read by a writer, not a task of its own: the one that has sent everything there is reads the next
message (one read out at a time), keeps it, and sends it on; another writer (a hedge, a retry replaying)
waits for it. For the usual call, one attempt, that is one task doing what a pump and a writer did. Nothing
waits for more of the request than has arrived: a client that sends one message and waits for the answer
(interactive bidi calls), or sends none until the server speaks, is forwarded at once. While no attempt is
out (before the first, a backoff wait), nothing is read: the client waits on grpc's flow control.

A writer whose attempt ends while it reads the client is not cancelled (a read abandoned half-way would
lose its message): it finishes that read, keeps the message for the attempts after it, and stops
(:meth:`RequestStream.stop`); any other writer is cancelled at once.

The messages are kept in the adapters' shared :class:`~sidecar.adapters.replay.ReplayBuffer` (positions:
the n-th message has position n). While the stream is replayable it is held whole, up to ``limit`` bytes.
When it outgrows the limit while an attempt is sending it, it is sealed (the writer's ``on_overflow``: the
engine hears ``buffer_exceeded``; the stream's: telemetry counts it): no further attempt may start, and
messages are dropped once every live writer has sent them. A commit seals it too. Over the limit with no
attempt out, nothing more is read, so the next attempt still has the whole request (and seals it). Once
sealed, the client is read only while less than ``limit`` bytes wait to be sent (backpressure on the client
instead of unbounded memory).

Every message held counts against the process-wide buffer budget (``limits.max_buffered_bytes``,
``buffer_budget.py``) until it is dropped: while the budget is full, the client is not read (grpcio hands
messages over whole, so the budget is passed by one message at most per call), and the call's own deadline
ends a call that stays stalled.

``on_complete`` (the driver's ``request_complete``, :meth:`RequestStream.driven_by`) is called once, when the
client has half-closed and a writer has sent the whole request upstream (the engine's ``RequestComplete``:
per-try timeouts start then).

``close`` ends the stream with its call: the messages are let go, a read of the client still out is
cancelled, and a writer still out (its attempt's cancel is on its way) sends nothing more, neither a message
nor the half-close, once its write in flight returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from ...buffer_budget import BufferBudget
from ..replay import ReplayBuffer

if TYPE_CHECKING:
    from ...runtime import Driver

log = logging.getLogger("sidecar.grpc")

Read = Callable[[], Awaitable[Any]]
EOF = grpc.aio.EOF


class _Writer:
    __slots__ = ("position", "on_overflow", "stopped")

    def __init__(self, position: int, on_overflow: Callable[[], None]) -> None:
        self.position = position
        self.on_overflow = on_overflow
        self.stopped = False  # its attempt ended while it was reading the client (``stop``)


class RequestStream:
    def __init__(
        self,
        read: Read,
        limit: int,
        on_overflow: Callable[[], None] | None = None,
        on_complete: Callable[[], None] | None = None,
        budget: BufferBudget | None = None,
    ) -> None:
        self._read = read
        self._budget = budget
        self._ticket: int | None = None  # waiting for the budget to have room
        self.kept = ReplayBuffer(limit, budget=budget)
        self.eof = False
        self.broken = False  # reading the client failed: nothing more is read (and no half-close sent)
        self.overflowed = False
        self.closed = False  # the call is over: nothing more goes upstream
        self._on_overflow = on_overflow
        self._on_complete = on_complete
        self._writers: dict[int, _Writer] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._reader: asyncio.Task[Any] | None = None  # the writer's task whose read of the client is out

    @property
    def replayable(self) -> bool:
        return self.kept.replayable

    # -- reading the client: by the writer at the live edge ---------------------------------------------
    def _may_read(self) -> bool:
        """A writer that has sent everything there is may read the client's next message: when no other
        read is out, the client has not half-closed, and there is room (``_room``)."""
        return self._reader is None and not self.eof and not self.broken and self._room()

    async def _read_one(self) -> None:
        """Read the client's next message into the buffer (or its half-close). The read is not abandoned
        half-way: a writer reading when its attempt ends is let finish (``stop``), so no message is lost."""
        self._reader = asyncio.current_task()
        try:
            msg = await self._read()
        except Exception as e:  # noqa: BLE001 - the client's stream broke: never half-close for it
            log.debug("reading the client's request stream failed: %r", e)
            self.broken = True
            return
        finally:
            self._reader = None
        if msg is EOF:
            self.eof = True
            self._changed()
            return
        self._append(msg)

    def _append(self, msg: bytes) -> None:
        self.kept.add(msg)
        self._check_overflow()
        self._changed()

    def _room(self) -> bool:
        budget = self._budget
        if budget is not None and budget.full():
            if self._ticket is None:
                self._ticket = budget.wait(0, self._budget_room)
            return False
        kept = self.kept
        if kept.replayable:
            return not kept.over_limit()  # over it with no attempt out: wait for one (then seal)
        return kept.size < kept.limit

    def _check_overflow(self) -> None:
        if self.kept.replayable and self.kept.over_limit() and self._writers:
            self.overflowed = True
            self.seal()
            for w in list(self._writers.values())[:1]:
                w.on_overflow()

    def seal(self) -> None:
        """No attempt will start after the ones out now (a commit, or the buffer overflowed)."""
        if not self.kept.seal():
            return
        if self.overflowed and self._on_overflow is not None:
            self._on_overflow()
        self._trim()
        self._changed()

    def over(self) -> bool:
        """Closed: the call is over. (A method, not the attribute: an await may close the stream, and a
        compiled caller must read it again; ``sidecar/native.py``.)"""
        return self.closed

    def driven_by(self, driver: Driver) -> None:
        """The call's driver is told when the whole request went upstream (``drive``'s ``started``)."""
        self._on_complete = driver.request_complete

    # -- writers: buffer -> one attempt ----------------------------------------------------------------
    async def feed(
        self,
        attempt: int,
        write: Callable[[bytes], Awaitable[Any]],
        done_writing: Callable[[], Awaitable[Any]],
        on_overflow: Callable[[], None],
    ) -> None:
        """Send the whole request to one attempt: what is buffered, then live messages, then half-close
        (nothing more once the stream is closed: every await may return to a closed one)."""
        if self.over():
            return
        kept = self.kept
        kept.check_whole("the request stream")
        w = self._writers[attempt] = _Writer(0, on_overflow)
        self._check_overflow()
        try:
            while True:
                while w.position < kept.end:
                    await write(kept.at(w.position))
                    if self.over():
                        return
                    w.position += 1
                    if not kept.replayable:
                        self._trim()
                if self.eof:
                    await done_writing()
                    if self._on_complete is not None:
                        done, self._on_complete = self._on_complete, None
                        done()
                    return
                if self._may_read():
                    await self._read_one()
                    if self.over() or w.stopped:
                        return
                else:
                    await self._wait()  # another writer's read, room in the budget or the buffer
                    if self.over():
                        return
        finally:
            self._writers.pop(attempt, None)
            if not kept.replayable:
                self._trim()

    def stop(self, attempt: int, writer: asyncio.Task[Any]) -> None:
        """Attempt ``attempt`` ended: its writer (``writer``, the task running its ``feed``) sends nothing
        more. Cancelled, unless it is reading the client: a read cancelled half-way would lose the message,
        so it finishes that read, keeps what came for the attempts after it, and stops."""
        if writer.done():
            return
        if self._reader is not writer:
            writer.cancel()
            return
        w = self._writers.pop(attempt, None)
        if w is not None:
            w.stopped = True
            if not self.kept.replayable:
                self._trim()  # what only it had left to send

    def _trim(self) -> None:
        """Sealed: let go of what every writer has sent."""
        kept = self.kept
        low = kept.end
        for w in self._writers.values():  # (a loop: a generator here is made on every call)
            if w.position < low:
                low = w.position
        if low > kept.first:
            kept.trim(low)
            self._changed()

    # -- plumbing --------------------------------------------------------------------------------------
    def _budget_room(self) -> None:
        self._ticket = None
        self._changed()

    def _changed(self) -> None:
        if not self._waiters:
            return
        waiters, self._waiters = self._waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)

    async def _wait(self) -> None:
        f = asyncio.get_running_loop().create_future()
        self._waiters.append(f)
        await f

    def close(self) -> None:
        """The call is over: stop reading the client, let go of the messages, end the writers."""
        self.closed = True
        if self._reader is not None:
            self._reader.cancel()  # the call is over: its read no longer matters
        self._changed()
        if self._budget is not None and self._ticket is not None:
            self._budget.cancel(self._ticket)
            self._ticket = None
        self.kept.let_go()
