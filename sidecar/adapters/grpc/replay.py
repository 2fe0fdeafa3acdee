"""The client's request messages: forwarded as they arrive, kept for replay (A6 "buffered RPCs").

Every call, whatever its shape, is forwarded as a stream: a pump task reads the client into a
:class:`RequestStream` from the start, and each attempt's writer sends what is buffered, then follows live
messages, then half-closes once the client did. Nothing waits for more of the request than has arrived: a
client that sends one message and waits for the answer (interactive bidi calls), or sends none until the
server speaks, is forwarded at once.

The messages are kept in the adapters' shared :class:`~sidecar.adapters.replay.ReplayBuffer` (positions:
the n-th message has position n). While the stream is replayable it is held whole, up to ``limit`` bytes. When it outgrows the limit while an
attempt is sending it, it is sealed (``on_overflow``: the engine hears ``buffer_exceeded``): no further attempt
may start, and messages are dropped once every live writer has sent them. A commit seals it too. While no
attempt is out (a backoff wait), the pump stops reading rather than overflow, so the next attempt still has
the whole request. Once sealed, the pump reads only while less than ``limit`` bytes wait to be sent
(backpressure on the client instead of unbounded memory).

Every message held counts against the process-wide buffer budget (``limits.max_buffered_bytes``,
``buffer_budget.py``) until it is dropped: while the budget is full, the pump reads no more (grpcio hands
messages over whole, so the budget is passed by one message at most per call), and the call's own deadline
ends a call that stays stalled.

``on_complete`` is called once, when the client has half-closed and a writer has sent the whole request
upstream (the engine's ``RequestComplete``: per-try timeouts start then).

``close`` ends the stream with its call: the messages are let go, and a writer still out (its attempt's
cancel is on its way) sends nothing more, neither a message nor the half-close, once its write in flight
returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from ...buffer_budget import BufferBudget
from ..replay import ReplayBuffer

log = logging.getLogger("sidecar.grpc")

Read = Callable[[], Awaitable[Any]]
EOF = grpc.aio.EOF


class _Writer:
    __slots__ = ("position", "on_overflow")

    def __init__(self, position: int, on_overflow: Callable[[], None]) -> None:
        self.position = position
        self.on_overflow = on_overflow


class RequestStream:
    def __init__(
        self,
        read: Read,
        limit: int,
        on_seal: Callable[[bool], None] | None = None,
        on_complete: Callable[[], None] | None = None,
        budget: BufferBudget | None = None,
    ) -> None:
        self._read = read
        self._budget = budget
        self._ticket: int | None = None  # waiting for the budget to have room
        self.kept = ReplayBuffer(limit, budget=budget)
        self.eof = False
        self.overflowed = False
        self.closed = False  # the call is over: nothing more goes upstream
        self._on_seal = on_seal
        self._on_complete = on_complete
        self._writers: dict[int, _Writer] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._pump: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(self._run_pump())

    @property
    def replayable(self) -> bool:
        return self.kept.replayable

    # -- the pump: client -> buffer --------------------------------------------------------------------
    async def _run_pump(self) -> None:
        while True:
            if not self._room():
                await self._until(self._room)
            try:
                msg = await self._read()
            except Exception as e:  # noqa: BLE001 - the client's stream broke: never half-close for it
                log.debug("reading the client's request stream failed: %r", e)
                return
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
        if self._on_seal is not None:
            self._on_seal(self.overflowed)
        self._trim()
        self._changed()

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
        if self.closed:
            return
        kept = self.kept
        kept.check_whole("the request stream")
        w = self._writers[attempt] = _Writer(0, on_overflow)
        self._check_overflow()
        try:
            while True:
                while w.position < kept.end:
                    await write(kept.at(w.position))
                    if self.closed:
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
                await self._wait()
                if self.closed:
                    return
        finally:
            self._writers.pop(attempt, None)
            if not kept.replayable:
                self._trim()

    def _trim(self) -> None:
        """Sealed: let go of what every writer has sent."""
        kept = self.kept
        low = min((w.position for w in self._writers.values()), default=kept.end)
        if low > kept.first:
            kept.trim(low)
            self._changed()

    # -- plumbing --------------------------------------------------------------------------------------
    def _budget_room(self) -> None:
        self._ticket = None
        self._changed()

    def _changed(self) -> None:
        waiters, self._waiters = self._waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)

    async def _wait(self) -> None:
        f = asyncio.get_running_loop().create_future()
        self._waiters.append(f)
        await f

    async def _until(self, cond: Callable[[], bool]) -> None:
        while not cond():
            await self._wait()

    def close(self) -> None:
        """The call is over: stop reading the client, let go of the messages, end the writers."""
        self.closed = True
        if self._pump is not None:
            self._pump.cancel()
        self._changed()
        if self._budget is not None and self._ticket is not None:
            self._budget.cancel(self._ticket)
            self._ticket = None
        self.kept.let_go()
