"""The model server's core, shared by both engines: the seed's latency law and the faults, without I/O.

The seed's server answers a request once its age exceeds a delay computed from the number of requests in
flight *now*, re-checked every ``tick``:

    delay(c) = min_delay                                   for c <= concurrency_limit
             = min_delay * factor ** ((c - limit) / k)    above

so a crowd makes every request in it slower, including the ones already waiting. Each request also gets
a random ``0..jitter`` of its own and, for ``slow_fraction`` of requests, a size of ``slow_factor`` (it
needs that many times the delay). Work is never abandoned: a request whose client went away keeps its
place until its answer is due, as in the seed (its handler never looks at the connection).

``admit(now, job)`` takes a request; ``due(now)`` returns the ``(job, status)`` pairs whose answers are
due. Time and randomness come in: the des engine passes virtual time, the live server its loop's clock.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Hashable

from .scenario import OutageSpec, ServerSpec

OK = 200
UNAVAILABLE = 503


def delay(spec: ServerSpec, inflight: int, capacity: float = 1.0) -> float:
    """The law: seconds a request of size 1 takes with ``inflight`` requests in the server."""
    limit = spec.concurrency_limit * capacity
    base = spec.min_delay / capacity
    if inflight <= limit:
        return base
    exponent = (inflight - limit) / spec.k
    if exponent > 10_000:  # far past any timeout; avoid overflow
        return float("inf")
    return base * spec.factor**exponent


class ModelServer:
    __slots__ = ("spec", "outage", "rand", "inflight", "_heaps", "_seq")

    def __init__(self, spec: ServerSpec, outage: OutageSpec | None, rand: random.Random) -> None:
        self.spec = spec
        self.outage = outage
        self.rand = rand
        self.inflight = 0
        # One heap per request size, ordered by start + own jitter: within a size, that is the order in
        # which answers fall due whatever the delay is.
        self._heaps: dict[float, list[tuple[float, int, Hashable, int]]] = {}
        self._seq = 0

    def _fault(self, now: float) -> str | None:
        o = self.outage
        if o is not None and o.start <= now < o.end:
            return o.mode
        return None

    def capacity(self, now: float) -> float:
        o = self.outage
        return o.capacity if o is not None and self._fault(now) == "brownout" else 1.0

    def admit(self, now: float, job: Hashable) -> int | None:
        """Take a request. Returns a status when it is answered at once (an ``error`` outage), else ``None``:
        the answer comes from :meth:`due`."""
        if self._fault(now) == "error":
            return UNAVAILABLE
        spec = self.spec
        r = self.rand.random
        status = UNAVAILABLE if spec.error_rate and r() < spec.error_rate else OK
        size = spec.slow_factor if spec.slow_fraction and r() < spec.slow_fraction else 1.0
        extra = r() * spec.jitter
        heap = self._heaps.get(size)
        if heap is None:
            heap = self._heaps[size] = []
        self._seq += 1
        heapq.heappush(heap, (now + extra, self._seq, job, status))
        self.inflight += 1
        return None

    def due(self, now: float) -> list[tuple[Hashable, int]]:
        """Answers due at ``now`` (call every ``tick``)."""
        if not self.inflight:
            return []
        d = delay(self.spec, self.inflight, self.capacity(now))
        out: list[tuple[Hashable, int]] = []
        for size, heap in self._heaps.items():
            threshold = now - size * d
            while heap and heap[0][0] <= threshold:
                _, _, job, status = heapq.heappop(heap)
                out.append((job, status))
        self.inflight -= len(out)
        return out
