"""The open connections of one listener, and how they drain on stop (SIGTERM): one implementation for the
listeners that own their connections (HTTP, MongoDB; gRPC's drains through grpcio).

The drain: every connection is told to close once its answer is out; an idle one (a keep-alive connection
between requests) closes at once; the listener waits, up to ``grace`` seconds, until no connection is
answering anything, then drops whatever is left. A connection says when it becomes idle (``idle``) or goes
(``discard``); nothing polls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class Drainable(Protocol):
    @property
    def busy(self) -> bool:
        """Is a request being answered on it?"""
        ...

    def close_after_answer(self) -> None:
        """Close once the answer in progress (if any) is out; take no new request."""
        ...

    def close(self) -> None: ...

    def drop(self) -> None:
        """Close at once, whatever is in progress."""
        ...


C = TypeVar("C", bound=Drainable)


class Connections(Generic[C]):
    def __init__(self, listener: str, log: logging.Logger) -> None:
        self.listener = listener
        self.log = log  # the adapter's
        self._open: set[C] = set()
        self._drained: asyncio.Event | None = None  # set while a drain waits

    def add(self, conn: C) -> None:
        self._open.add(conn)

    def discard(self, conn: C) -> None:
        self._open.discard(conn)
        self.idle(conn)

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._open))  # a copy: closing a connection changes the set

    def busy(self) -> int:
        """How many connections are answering a request now."""
        return sum(1 for c in self._open if c.busy)

    def idle(self, conn: C) -> None:
        """``conn`` finished answering (or went): the drain may be over."""
        drained = self._drained
        if drained is not None and not drained.is_set() and not self.busy():
            drained.set()

    async def drain(self, grace: float) -> None:
        """Let the requests in progress be answered for up to ``grace`` seconds, closing each connection
        once it is idle; then drop every connection left."""
        for conn in self:
            conn.close_after_answer()
            if not conn.busy:
                conn.close()
        if grace > 0 and self.busy():
            drained = self._drained = asyncio.Event()
            try:
                async with asyncio.timeout(grace):
                    await drained.wait()
            except TimeoutError:
                self.log.warning(
                    "listener %s: %d connection(s) still busy after %.1fs; closing",
                    self.listener,
                    self.busy(),  # now, not when the drain began: those answered since are not counted
                    grace,
                )
            finally:
                self._drained = None
        for conn in self:
            conn.drop()
