"""Execution control of one endpoint, assembled: its read and write ticket pools, and their limits, fixed or
set by the throughput prober every interval.

This is the loop the wiring runs on a timer (issue 12's ``concurrency.interval``): the pools report the
interval (``prober.Interval``: tickets returned, exhausted or not, peak use, attempts let through or turned
away), the prober computes new limits, the pools apply them, and the
waiters a larger limit grants are handed back to be woken. In ``fixed`` mode the limits never change.

A reload changes the settings in place (:meth:`EndpointConcurrency.reconfigure`): tickets held stay held,
waiters keep their place, and a larger limit grants them at once.
"""

from __future__ import annotations

import math

from .prober import ProbeSpec, ProbeState, ThroughputProber, split_concurrency
from .tickets import Kind, TicketPools


class EndpointConcurrency:
    __slots__ = ("pools", "prober")

    def __init__(
        self, spec: ProbeSpec, now: float, probing: bool, max_queue: int = 0, max_wait: float = math.inf
    ) -> None:
        """``spec.initial`` tickets (reads + writes, split by ``spec.read_write_ratio``); with ``probing``, the
        seed's prober moves them within ``[spec.min, spec.max]``."""
        self.prober = ThroughputProber(spec, now) if probing else None
        read, write = split_concurrency(spec.initial, spec.read_write_ratio)
        self.pools = TicketPools(read, write, max_queue, max_wait)

    def reconfigure(
        self, spec: ProbeSpec, now: float, probing: bool, max_queue: int = 0, max_wait: float = math.inf
    ) -> list[tuple[Kind, int]]:
        """New settings: the limits become ``spec.initial`` (split by the ratio), probed from ``now`` when
        ``probing``; the queue's limits change for new waiters (those queued stay). Returns the waiters the
        new limits grant."""
        self.prober = ThroughputProber(spec, now) if probing else None
        for pool in (self.pools.read, self.pools.write):
            pool.set_queue(max_queue, max_wait)
        self.pools.take_interval()
        return self.pools.set_limits(*split_concurrency(spec.initial, spec.read_write_ratio))

    def resume(self, now: float) -> None:
        """The caller stopped running intervals while the endpoint was idle (nothing held, nobody queued):
        a fresh interval starts at ``now``."""
        self.pools.take_interval()
        if self.prober is not None:
            self.prober.restart(now)

    @property
    def probe_state(self) -> ProbeState:
        """For ``sidecar_concurrency_probe_state`` (always stable when the limits are fixed)."""
        return self.prober.state if self.prober is not None else ProbeState.STABLE

    def on_interval(self, now: float) -> list[tuple[Kind, int]]:
        """An interval ended at ``now``: probe, apply the new limits, return the waiters they grant."""
        interval = self.pools.take_interval()
        prober = self.prober
        if prober is None:
            return []
        prober.run(now, interval)
        return self.pools.set_limits(prober.read, prober.write)
