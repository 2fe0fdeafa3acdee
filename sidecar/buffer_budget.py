"""The process-wide bound on bytes the listeners hold in their buffers (``limits.max_buffered_bytes``).

Every listener's buffers draw on the same budget: a MongoDB message being read (reserved whole when its
header announces its length), and so on. A reservation that does not fit is not granted: the caller stops
reading (back-pressure) and asks to be called back when bytes are released (``wait``); its own timeout
(``message_timeout``) closes it if room never comes. So the sidecar holds at most the budget (plus one socket
read per connection), never what a client announces.

Waiters are served in arrival order as room comes, but a reservation that fits now is granted at once even
when larger ones wait: a small request of a good client is not held behind a stalled giant.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class BufferBudget:
    __slots__ = ("capacity", "used", "_waiters", "_next")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._waiters: OrderedDict[int, tuple[int, Callable[[], None]]] = OrderedDict()
        self._next = 0

    def reserve(self, n: int) -> bool:
        """Take ``n`` bytes if they fit now."""
        if self.used + n > self.capacity:
            return False
        self.used += n
        return True

    def charge(self, n: int) -> None:
        """Account for ``n`` bytes already in hand (a message read whole by a library): the caller stops
        reading more while :meth:`full`; this may pass the capacity by what was in hand."""
        self.used += n

    def full(self) -> bool:
        return self.used >= self.capacity

    def release(self, n: int) -> None:
        self.used -= n
        assert self.used >= 0, "released more buffer bytes than were reserved"
        self._serve()

    def wait(self, n: int, granted: Callable[[], None]) -> int:
        """Call ``granted()`` once ``n`` bytes are reserved for the caller (``n`` 0: once the budget is not
        :meth:`full`); a ticket for ``cancel``."""
        self._next += 1
        self._waiters[self._next] = (n, granted)
        self._serve()
        return self._next

    def cancel(self, ticket: int) -> None:
        self._waiters.pop(ticket, None)

    def resize(self, capacity: int) -> None:
        """A reloaded ``limits.max_buffered_bytes``: what is held stays held; new reservations see it."""
        self.capacity = capacity
        self._serve()

    def _serve(self) -> None:
        for ticket, (n, granted) in list(self._waiters.items()):
            if (self.used + n <= self.capacity) if n else self.used < self.capacity:
                del self._waiters[ticket]
                self.used += n
                granted()
