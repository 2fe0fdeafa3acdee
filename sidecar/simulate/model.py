"""The model server's core, shared by both engines: the seed's latency law and the faults, without I/O.

The seed's server answers a request once its age exceeds a delay computed from the number of requests in
flight *now*, re-checked every ``tick``:

    delay(c) = min_delay                                   for c <= concurrency_limit
             = min_delay * factor ** ((c - limit) / k)    above

so a crowd makes every request in it slower, including the ones already waiting. Each request also gets
a random ``0..jitter`` of its own and, for ``slow_fraction`` of requests, a size of ``slow_factor`` (it
needs that many times the delay). Work is never abandoned: a request whose client went away keeps its
place until its answer is due, as in the seed (its handler never looks at the connection).

With ``workers`` set the server has a real knee instead (``bench/goodput.py``'s upstream): that many
workers, each busy ``min_delay`` per request (times its size, plus its own jitter); the rest wait their turn,
first come first served, and a worker that frees up takes the next one at once. Below the knee nothing
waits; past it, throughput stays at ``workers / min_delay`` and the queue, and every latency, grows.

``admit(now, job)`` takes a request; ``due(now)`` returns the ``(job, status)`` pairs whose answers are
due. Time and randomness come in: the des engine passes virtual time, the live server its loop's clock.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
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
    __slots__ = ("spec", "outage", "rand", "inflight", "_heaps", "_seq", "_busy", "_waiting")

    def __init__(self, spec: ServerSpec, outage: OutageSpec | None, rand: random.Random) -> None:
        self.spec = spec
        self.outage = outage
        self.rand = rand
        self.inflight = 0
        # One heap per request size, ordered by start + own jitter: within a size, that is the order in
        # which answers fall due whatever the delay is.
        self._heaps: dict[float, list[tuple[float, int, Hashable, int]]] = {}
        self._seq = 0
        # ``workers``: the requests being worked on, by when they are done, and those waiting for a worker
        self._busy: list[tuple[float, int, Hashable, int]] = []
        self._waiting: deque[tuple[float, float, Hashable, int]] = deque()  # (arrival, service, job, status)

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
        self.inflight += 1
        if spec.workers is not None:
            service = size * spec.min_delay / self.capacity(now) + extra
            if len(self._busy) < spec.workers:
                self._work(now, service, job, status)
            else:
                self._waiting.append((now, service, job, status))
            return None
        heap = self._heaps.get(size)
        if heap is None:
            heap = self._heaps[size] = []
        self._seq += 1
        heapq.heappush(heap, (now + extra, self._seq, job, status))
        return None

    def _work(self, start: float, service: float, job: Hashable, status: int) -> None:
        self._seq += 1
        heapq.heappush(self._busy, (start + service, self._seq, job, status))

    def due(self, now: float) -> list[tuple[Hashable, int]]:
        """Answers due at ``now`` (call every ``tick``)."""
        if not self.inflight:
            return []
        if self.spec.workers is not None:
            return self._due_workers(now)
        d = delay(self.spec, self.inflight, self.capacity(now))
        out: list[tuple[Hashable, int]] = []
        for size, heap in self._heaps.items():
            threshold = now - size * d
            while heap and heap[0][0] <= threshold:
                _, _, job, status = heapq.heappop(heap)
                out.append((job, status))
        self.inflight -= len(out)
        return out

    def _due_workers(self, now: float) -> list[tuple[Hashable, int]]:
        """Work done by ``now``; each worker that finished takes the next waiting request from the moment it
        finished (or the request arrived, if later)."""
        busy, waiting = self._busy, self._waiting
        out: list[tuple[Hashable, int]] = []
        while busy and busy[0][0] <= now:
            done, _, job, status = heapq.heappop(busy)
            out.append((job, status))
            if waiting:
                arrival, service, next_job, next_status = waiting.popleft()
                self._work(max(done, arrival), service, next_job, next_status)
        self.inflight -= len(out)
        return out
