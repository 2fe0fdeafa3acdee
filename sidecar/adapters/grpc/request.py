"""The client's request messages: read once from the client, replayed to every attempt (A6 "buffered RPCs").

A call whose request turned out to be one message (unary and server-streaming calls: the client half-closed
right after it) is sent upstream as one message. Any other call streams: a pump task reads the client into a
:class:`RequestStream`, and each attempt's writer sends it from the start, then follows live messages.

While the stream is replayable it is held whole, up to ``limit`` bytes. When it outgrows the limit while an
attempt is sending it, it is sealed (``on_overflow``: the engine hears ``buffer_exceeded``): no further attempt
may start, and messages are dropped once every live writer has sent them. A commit seals it too. While no
attempt is out (a backoff wait), the pump stops reading rather than overflow, so the next attempt still has
the whole request. Once sealed, the pump reads only while less than ``limit`` bytes wait to be sent
(backpressure on the client instead of unbounded memory).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from ...timers import timers_for

log = logging.getLogger("sidecar.grpc")

Read = Callable[[], Awaitable[Any]]
EOF = grpc.aio.EOF


@dataclass(slots=True)
class Opening:
    """What was read before choosing how to forward: the first messages, and whether the client is done.

    ``pending``: the opening read still in progress (streaming calls). It appends to ``messages`` and
    returns whether the client half-closed; the pump takes over from it."""

    messages: list[bytes]
    eof: bool
    pending: asyncio.Task[bool] | None

    @property
    def single(self) -> bool:
        return self.eof and len(self.messages) == 1


async def read_opening(read: Read, window: float) -> Opening:
    """Read up to two messages or the end of the request, waiting at most ``window`` seconds in all.

    A unary client sends its message and half-closes together, so both arrive at once; a streaming client
    may send one message and wait for an answer, or send nothing until the server speaks: after the window
    such a call is forwarded as a stream (the pending read carries on in the pump). One task per call; the
    window is a wake-up on the runtime's shared timer heap, not a loop timer."""
    loop = asyncio.get_running_loop()
    messages: list[bytes] = []

    async def two() -> bool:
        while len(messages) < 2:
            msg = await read()
            if msg is EOF:
                return True
            messages.append(msg)
        return False

    task = loop.create_task(two())
    if window > 0:
        ready = loop.create_future()

        def wake(_: object = None) -> None:
            if not ready.done():
                ready.set_result(None)

        task.add_done_callback(wake)
        timers = timers_for(loop)
        entry = timers.call_at(loop.time() + window, wake)
        try:
            await ready
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            timers.cancel(entry)
            task.remove_done_callback(wake)
    if task.done():
        return Opening(messages, task.result(), None)
    return Opening(messages, False, task)


class _Writer:
    __slots__ = ("position", "on_overflow")

    def __init__(self, position: int, on_overflow: Callable[[], None]) -> None:
        self.position = position
        self.on_overflow = on_overflow


class RequestStream:
    def __init__(
        self, read: Read, opening: Opening, limit: int, on_seal: Callable[[bool], None] | None = None
    ) -> None:
        self._read = read
        self.limit = limit
        self.messages: list[bytes] = list(opening.messages)
        self.first = 0  # stream index of messages[0]
        self.size = sum(len(m) for m in self.messages)
        self.count = len(self.messages)
        self.eof = opening.eof
        self.replayable = True
        self.overflowed = False
        self._on_seal = on_seal
        self._writers: dict[int, _Writer] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._pump: asyncio.Task[None] | None = None
        self._opening_read = opening.pending
        if not self.eof:
            self._pump = asyncio.get_running_loop().create_task(self._run_pump(opening))

    # -- the pump: client -> buffer --------------------------------------------------------------------
    async def _run_pump(self, opening: Opening) -> None:
        if opening.pending is not None:
            try:
                eof = await opening.pending
            except Exception as e:  # noqa: BLE001 - the client's stream broke: never half-close for it
                log.debug("reading the client's request stream failed: %r", e)
                return
            for msg in opening.messages[self.count :]:
                self._append(msg)
            if eof:
                self.eof = True
                self._changed()
                return
        while True:
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
        self.messages.append(msg)
        self.size += len(msg)
        self.count += 1
        self._check_overflow()
        self._changed()

    def _room(self) -> bool:
        if self.replayable:
            return self.size <= self.limit  # over it with no attempt out: wait for one (then seal)
        return self.size < self.limit

    def _check_overflow(self) -> None:
        if self.replayable and self.size > self.limit and self._writers:
            self.overflowed = True
            self.seal()
            for w in list(self._writers.values())[:1]:
                w.on_overflow()

    def seal(self) -> None:
        """No attempt will start after the ones out now (a commit, or the buffer overflowed)."""
        if not self.replayable:
            return
        self.replayable = False
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
        """Send the whole request to one attempt: what is buffered, then live messages, then half-close."""
        if self.first > 0:
            raise RuntimeError("request stream already trimmed: this attempt cannot replay it")
        w = self._writers[attempt] = _Writer(0, on_overflow)
        self._check_overflow()
        try:
            while True:
                while w.position < self.first + len(self.messages):
                    msg = self.messages[w.position - self.first]
                    await write(msg)
                    w.position += 1
                    if not self.replayable:
                        self._trim()
                if self.eof:
                    await done_writing()
                    return
                await self._wait()
        finally:
            self._writers.pop(attempt, None)
            if not self.replayable:
                self._trim()

    def _trim(self) -> None:
        low = min((w.position for w in self._writers.values()), default=self.first + len(self.messages))
        drop = low - self.first
        if drop > 0:
            self.size -= sum(len(m) for m in self.messages[:drop])
            del self.messages[:drop]
            self.first = low
            self._changed()

    # -- plumbing --------------------------------------------------------------------------------------
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
        if self._pump is not None:
            self._pump.cancel()
        if self._opening_read is not None:
            self._opening_read.cancel()
        self._changed()
        self.messages.clear()
