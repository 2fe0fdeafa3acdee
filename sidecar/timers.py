"""Many deadlines, one loop timer.

Every request has a wake time (its deadline, a per-try timeout, a backoff, a hedge). Arming a loop timer per
request is expensive on uvloop (``call_at`` + ``cancel`` about 6 us, ``asyncio.timeout`` about 11 us: more than
the whole policy engine), and almost every such timer is cancelled long before it fires. So the runtime keeps
its own heap of wake-ups per event loop and arms a single loop timer for the earliest one. Adding an entry is a
heap push; cancelling is marking it dead; dead entries are dropped lazily and the heap is compacted when they
outnumber the live ones, so memory stays proportional to requests in flight.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import weakref
from collections.abc import Callable
from typing import Any, Final

_INF: Final = math.inf
log: Final = logging.getLogger("sidecar.timers")


#: ``[when, seq, callback]``: a list, so that the heap compares entries in C (a class with ``__lt__`` costs a
#: Python call per comparison); ``callback`` is ``None`` once the entry fired or was cancelled.
TimerEntry = list[Any]

_WHEN: Final = 0
_SEQ: Final = 1
_CALLBACK: Final = 2
_heappush: Final = heapq.heappush  # a constant: compiled, ``heapq.heappush`` is a lookup


class Timers:
    __slots__ = ("loop", "_heap", "_seq", "_handle", "_armed_at", "_dead")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._heap: list[TimerEntry] = []
        self._seq = 0
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = _INF
        self._dead = 0

    def call_at(self, when: float, callback: Callable[[], object]) -> TimerEntry:
        """Run ``callback`` at loop time ``when`` (or soon after), unless cancelled first."""
        self._seq += 1
        entry = [when, self._seq, callback]
        _heappush(self._heap, entry)
        if when < self._armed_at:
            self._arm(when)
        return entry

    def cancel(self, entry: TimerEntry) -> None:
        if entry[_CALLBACK] is None:
            return
        entry[_CALLBACK] = None
        self._dead += 1
        if self._dead > 64 and self._dead * 2 > len(self._heap):
            self._heap = [e for e in self._heap if e[_CALLBACK] is not None]
            heapq.heapify(self._heap)
            self._dead = 0

    def __len__(self) -> int:
        return len(self._heap) - self._dead

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed_at = when
        self._handle = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._armed_at = _INF
        heap = self._heap
        # Loop timers may fire up to a clock tick early; treat what is due within 1 ms as due.
        now = self.loop.time() + 0.001
        due: list[Callable[[], object]] = []
        while heap and heap[0][_WHEN] <= now:
            entry = heapq.heappop(heap)
            cb = entry[_CALLBACK]
            if cb is None:
                self._dead -= 1
            else:
                due.append(cb)
                entry[_CALLBACK] = None
        while heap and heap[0][_CALLBACK] is None:
            heapq.heappop(heap)
            self._dead -= 1
        if heap:
            self._arm(heap[0][_WHEN])
        for cb in due:
            try:
                cb()
            except Exception:  # one wake-up's bug must not strand the others due in this tick
                log.exception("a timer callback failed (%r)", cb)


_PER_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Timers] = weakref.WeakKeyDictionary()


def timers_for(loop: asyncio.AbstractEventLoop) -> Timers:
    """The loop's timer heap (one per event loop)."""
    t = _PER_LOOP.get(loop)
    if t is None:
        t = _PER_LOOP[loop] = Timers(loop)
    return t
