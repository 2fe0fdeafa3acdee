"""An upstream's execution control at run time (issue 12, the seed's ticket pools): for each of its endpoints
one :class:`~sidecar.admission.EndpointConcurrency` (read and write pools, and their prober), the loop timer
that runs the probers every ``concurrency.interval`` (one per upstream, never one per request), and who waits
for which ticket, so that a ticket coming back, or a larger limit, wakes the attempt it is handed to.

The pools decide (pure, ``sidecar/admission/``); this file carries their decisions out on the loop. Requests
reach it through their :class:`~sidecar.ticket_gate.TicketGate`. Endpoints are added as attempts first go to
them (a MongoDB replica set's members are found by monitoring, not configured).

The timer rests while every endpoint is idle (no ticket held, nobody queued, no attempt during the last
interval): an idle interval measures nothing and would change nothing (the seed's prober, run on it, probes
down and comes straight back), so an idle sidecar has no timer running. The next attempt wakes it.

A reload (:meth:`UpstreamConcurrency.reconfigure`) changes limits, queue bounds and probing in place: tickets
held stay held, waiters keep their place, and a larger limit grants them at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..admission import Decision, EndpointConcurrency, Kind, ProbeSpec, ProbeState, TicketPool
from ..config.schema import ConcurrencyConfig
from ..telemetry.metrics import Histogram

log = logging.getLogger("sidecar.concurrency")

#: Time spent queued for a ticket (``sidecar_admission_queue_seconds``).
QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

Wake = Callable[[], None]


def probe_spec(config: ConcurrencyConfig, initial: int | None = None) -> ProbeSpec:
    """The prober's parameters; a ``fixed`` block is a spec whose min and max are its ``initial``."""
    start = config.initial if initial is None else initial
    if config.mode == "fixed":
        return ProbeSpec(start, start, start, config.read_write_ratio, config.step, config.ema_weight)
    return ProbeSpec(start, config.min, config.max, config.read_write_ratio, config.step, config.ema_weight)


class EndpointTickets:
    """One endpoint: its pools and prober, and the attempts queued for its tickets (by pool and waiter)."""

    __slots__ = ("endpoint", "control", "wakes", "queue_time")

    def __init__(self, endpoint: str, control: EndpointConcurrency) -> None:
        self.endpoint = endpoint
        self.control = control
        self.wakes: dict[tuple[Kind, int], Wake] = {}
        self.queue_time = {Kind.READ: Histogram(QUEUE_BUCKETS), Kind.WRITE: Histogram(QUEUE_BUCKETS)}

    def pool(self, kind: Kind) -> TicketPool:
        return self.control.pools.pool(kind)

    def acquire(self, kind: Kind, now: float, deadline: float) -> Decision:
        return self.control.pools.pool(kind).acquire(now, deadline)

    def wait(self, kind: Kind, waiter: int, wake: Wake) -> None:
        """Queued ``waiter`` (of ``kind``'s pool) is woken by ``wake`` once a ticket is handed to it."""
        self.wakes[(kind, waiter)] = wake

    def forget(self, kind: Kind, waiter: int) -> None:
        """``waiter`` left the queue (gave up, or its attempt was cancelled): nobody is to be woken."""
        self.wakes.pop((kind, waiter), None)

    def release(self, kind: Kind) -> None:
        """A ticket of ``kind`` comes back; the waiter it passes to, if any, is woken."""
        waiter = self.control.pools.pool(kind).release()
        if waiter:
            self.wake([(kind, waiter)])

    def wake(self, granted: list[tuple[Kind, int]]) -> None:
        for key in granted:
            wake = self.wakes.pop(key, None)
            if wake is None:  # pragma: no cover - every queued attempt registers before control returns
                log.error("%s: a %s ticket was handed to waiter %d, which nobody waits for", self.endpoint, *key)
                self.control.pools.pool(key[0]).release()
                continue
            wake()

    @property
    def idle(self) -> bool:
        pools = self.control.pools
        return pools.in_use == 0 and pools.read.queued == 0 and pools.write.queued == 0


class UpstreamConcurrency:
    """The ``concurrency`` block of upstream ``name`` at work. ``endpoint`` is the way in."""

    def __init__(self, name: str, config: ConcurrencyConfig) -> None:
        self.name = name
        self.config = config
        self.endpoints: dict[str, EndpointTickets] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._active = False  # an attempt came since the last interval

    @property
    def probing(self) -> bool:
        return self.config.mode == "probing"

    def endpoint(self, endpoint: str, loop: asyncio.AbstractEventLoop) -> EndpointTickets:
        """The tickets of ``endpoint``, for an attempt about to take one (or to be counted exempt)."""
        self._active = True
        ep = self.endpoints.get(endpoint)
        if ep is None:
            self.loop = loop
            c = self.config
            control = EndpointConcurrency(probe_spec(c), loop.time(), self.probing, c.max_queue, c.max_wait)
            ep = self.endpoints[endpoint] = EndpointTickets(endpoint, control)
        if self._timer is None and self.probing:
            self._resume(loop)
        return ep

    def forget(self, endpoint: str) -> None:
        """``endpoint`` left the upstream's set and drained (``upstream/discovery.py``): its pools and prober
        go, when nothing holds or waits for a ticket (an address that comes back starts afresh)."""
        ep = self.endpoints.get(endpoint)
        if ep is not None and ep.idle:
            del self.endpoints[endpoint]

    def reconfigure(self, config: ConcurrencyConfig) -> None:
        """A reload changed the block: new limits now (the prober starts again from the current limit when
        neither ``mode`` nor ``initial`` changed, else from the new ``initial``), waiters kept."""
        old, self.config = self.config, config
        if config == old:
            return
        restart = config.mode != old.mode or config.initial != old.initial
        loop = self.loop
        now = loop.time() if loop is not None else 0.0
        for ep in self.endpoints.values():
            start = None
            if not restart and config.mode == "probing":
                start = min(config.max, max(config.min, ep.control.pools.limit))
            granted = ep.control.reconfigure(
                probe_spec(config, start), now, self.probing, config.max_queue, config.max_wait
            )
            ep.wake(granted)
        if self._timer is not None and (not self.probing or config.interval != old.interval):
            self._timer.cancel()
            self._timer = None
        if self.probing and self._timer is None and loop is not None and not loop.is_closed():
            self._arm(loop)

    # -- the prober's timer --------------------------------------------------------------------------------
    def _resume(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for ep in self.endpoints.values():
            ep.control.resume(now)
        self._arm(loop)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = loop.call_later(self.config.interval, self._interval)

    def _interval(self) -> None:
        """An interval is over: each endpoint's prober runs, and the waiters a larger limit grants are woken.
        Rests when nothing happened and nothing is held or queued (``endpoint`` wakes it)."""
        self._timer = None
        loop = self.loop
        if loop is None:  # pragma: no cover - armed only once an endpoint bound the loop
            return
        now = loop.time()
        busy = self._active
        self._active = False
        for ep in list(self.endpoints.values()):
            try:
                ep.wake(ep.control.on_interval(now))
            except Exception:  # a bug in one endpoint's probing must not stop the others'
                log.exception("upstream %r endpoint %s: probing failed", self.name, ep.endpoint)
            busy = busy or not ep.idle
        if busy and self.probing:
            self._arm(loop)

    # -- reading (metrics, tests) --------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Is the prober's timer armed (it rests while every endpoint is idle)?"""
        return self._timer is not None

    def probe_state(self, endpoint: str) -> ProbeState:
        return self.endpoints[endpoint].control.probe_state
