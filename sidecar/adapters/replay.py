"""What a request has sent so far, kept so that a retry or a hedge can send it again: the one replay buffer
of every adapter (HTTP request bodies in ``http/replay.py``, gRPC request messages in ``grpc/replay.py``).

The buffer holds the request as a stream of pieces (body chunks, messages), each with a position: the n-th
piece added has position n. While it is *replayable* it keeps every piece, up to ``limit`` bytes (the
policy's ``replay_buffer``); sealed (the limit was passed, a commit, a body declared too long), it keeps a
piece only as long as an attempt in flight still has to send it, and lets the rest go (``trim``). A piece
let go cannot be sent again: an attempt that needs the stream from its start is refused
(``check_whole``). When to seal, and what to tell the engine (``buffer_exceeded``), is the adapter's call:
HTTP seals at once when the body passes the limit, gRPC only while an attempt is out.

The bytes kept count against the process-wide ``limits.max_buffered_bytes`` (``budget``): charged as they
are kept, released as they are let go. Whether to stop reading while the budget is full is the adapter's
call, as the budget's doc says.

Pure bookkeeping: no sockets, no asyncio; the adapters deliver the pieces (push to sinks, pull by writers).
"""

from __future__ import annotations

from ..buffer_budget import BufferBudget


class ReplayBuffer:
    __slots__ = ("limit", "pieces", "first", "size", "received", "replayable", "budget")

    def __init__(self, limit: int, replayable: bool = True, budget: BufferBudget | None = None) -> None:
        self.budget = budget
        self.limit = limit
        self.pieces: list[bytes] = []  # kept: positions first .. first + len(pieces) - 1
        self.first = 0  # the position of pieces[0]: pieces before it were let go
        self.size = 0  # bytes kept
        self.received = 0  # bytes ever added
        self.replayable = replayable

    @property
    def end(self) -> int:
        """The position the next piece added will have."""
        return self.first + len(self.pieces)

    @property
    def whole(self) -> bool:
        """Is every piece since the start still kept?"""
        return self.first == 0

    def over_limit(self) -> bool:
        return self.size > self.limit

    def add(self, piece: bytes, keep: bool = True) -> None:
        """The next piece; ``keep=False``: sent on without being kept (what was kept before goes too)."""
        self.received += len(piece)
        budget = self.budget
        if keep:
            self.pieces.append(piece)
            self.size += len(piece)
            if budget is not None:
                budget.charge(len(piece))
        else:
            self.first = self.end + 1
            self.pieces.clear()
            if budget is not None and self.size:
                budget.release(self.size)
            self.size = 0

    def at(self, position: int) -> bytes:
        return self.pieces[position - self.first]

    def seal(self) -> bool:
        """No longer replayable. Returns whether it was."""
        was = self.replayable
        self.replayable = False
        return was

    def restrict(self, limit: int) -> None:
        """A smaller (or larger) limit from now on; past it already, it is no longer replayable."""
        self.limit = limit
        if self.received > limit:
            self.replayable = False

    def trim(self, position: int) -> None:
        """Let go of the pieces before ``position`` (no attempt has them left to send)."""
        drop = position - self.first
        if drop <= 0:
            return
        pieces = self.pieces
        before = self.size
        if drop >= len(pieces):
            pieces.clear()
            self.size = 0
        else:
            self.size -= sum(len(p) for p in pieces[:drop])
            del pieces[:drop]
        self.first = position
        if self.budget is not None and before > self.size:
            self.budget.release(before - self.size)

    def let_go(self) -> None:
        """Let go of every piece kept."""
        self.trim(self.end)

    def check_whole(self, what: str) -> None:
        """An attempt is about to send the stream from its start: refuse if some of it was let go."""
        if self.first > 0:
            raise RuntimeError(f"{what} was not kept: it cannot be sent again")
