"""Throughput probing (the seed, ``mongodb-server-admission-control.md``, "Throughput Probing"), run every
``interval`` by the caller, with two departures for a proxy whose limit refuses what it does not admit.

The seed, verbatim where it is precise (its pseudocode and diagram):

    run()          throughput := tickets returned / time elapsed; then by state:
    probeStable    record the throughput; below max and tickets exhausted: probe up (stable x (1 + step));
                   else above min: probe down (stable x (1 - step)); else (at min) no change
    probeUp        throughput increased: stable := EMA(stable, current), record the throughput;
    probeDown      either way set the stable concurrency and go back to stable

with ``EMA(stable, current) = current x ema_weight + stable x (1 - ema_weight)``.

Why depart. Inside mongod an operation that finds no ticket waits, so a probe costs a little latency. In a
proxy with a short ``max_wait`` or ``max_queue: 0`` a ticket not free is a refusal: the seed's probe down at
rest (tickets not exhausted), every other interval, turns requests away from an upstream that was never
overloaded; and a limit at the upstream's knee turns away the ordinary Poisson bursts of a load at or below
capacity, which the throughput of one interval cannot show (a burst's extra requests finish in later
intervals, and ten answers per interval vary by more than a step). So the prober tells three situations
apart, from what the pools saw during the interval (:class:`Interval`):

- **Overload** (the interval was *saturated*: exhausted, with at least as many attempts turned away, refused
  or still waiting, as let in; or exhausted while those turned away lately were at least half those let in). The seed's probing,
  unchanged: below max, probe up and let throughput decide; at max, probe down and let throughput decide.
  This is where a limit protects an upstream. (At max without saturation nothing changes: only saturation
  can show that less concurrency gives more throughput.)
- **Bursts** (exhausted, not saturated, and lately fewer than one attempt turned away for every two let in:
  the limit bound in moments while the upstream kept up). Departure 1: the probe up goes on up each interval
  while bursts keep exhausting the pools, to what the interval's demand needed (let in plus turned away,
  over let in; at least a step), and is kept whole when an interval passes without them exhausted (the
  raised limit covered the bursts); an interval saturated on the way ends it, back to the stable
  concurrency, as a probe up that found nothing.
- **At rest** (not exhausted). Departure 2: no probe ever lowers the door. Every ``QUIET`` intervals at rest
  the seed's probe down is tried on the *target* alone: kept (the seed's EMA) when the highest use of those
  intervals would have had at most half of it, never below ``initial``. So no request is refused or made to
  wait that the stable limit would have admitted; what bursts added decays once traffic no longer needs it;
  and a prober at rest at or below ``initial`` changes nothing (the seed's "at min, no change").

Where the seed is loose, this follows the server's own source (``throughput_probing.cpp``) or says why not:

- Concurrency is whole tickets: a target is rounded to the nearest integer, halves up (``std::round``). A
  probe that would round to the current concurrency moves it by one ticket instead (as the server does),
  else a small pool never probes.
- ``min`` and ``max`` bound the concurrency, reads plus writes (issue 12's ``initial``, ``min`` and ``max``
  count both): the pseudocode compares that sum against them, while its ``setConcurrency`` clamps each pool,
  which cannot both hold. The clamped total is then split by ``read_write_ratio``, each pool keeping at least
  one ticket so neither kind starves (hence ``min >= 2``).
- "Tickets exhausted" is an input: the pools say whether their peak use reached their limit (the server's
  ``peakUsed >= outof``) or a waiter queued during the interval.

The prober only computes limits; the caller applies them to the pools (:meth:`TicketPools.set_limits`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum


class ProbeState(IntEnum):
    """The gauge ``sidecar_concurrency_probe_state`` reports the value (the server's ``ProbingState`` order)."""

    STABLE = 0
    UP = 1
    DOWN = 2


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    """The seed's parameters: ``throughputProbing{Initial,Min,Max}Concurrency``, ``ReadWriteRatio``,
    ``StepMultiple``, ``ConcurrencyMovingAverageWeight``. ``initial``, ``min`` and ``max`` count tickets,
    reads plus writes."""

    initial: int
    min: int
    max: int
    read_write_ratio: float = 0.5
    step: float = 0.1
    ema_weight: float = 0.2

    def __post_init__(self) -> None:
        if self.min < 2:
            raise ValueError(f"min must be at least 2 (a read and a write ticket), not {self.min!r}")
        if self.max < self.min:
            raise ValueError(f"max ({self.max!r}) must not be below min ({self.min!r})")
        if not self.min <= self.initial <= self.max:
            raise ValueError(
                f"initial ({self.initial!r}) must be within min and max ([{self.min}, {self.max}])"
            )
        if not 0.0 <= self.read_write_ratio <= 1.0:
            raise ValueError(f"read_write_ratio must be within [0, 1], not {self.read_write_ratio!r}")
        if not 0.0 < self.step < 1.0:
            raise ValueError(f"step must be within (0, 1), not {self.step!r}")
        if not 0.0 < self.ema_weight <= 1.0:
            raise ValueError(f"ema_weight must be within (0, 1], not {self.ema_weight!r}")


@dataclass(frozen=True, slots=True)
class Interval:
    """What an endpoint's pools saw during one interval (``TicketPools.take_interval``): tickets returned
    by answered attempts (the throughput; not those of abandoned attempts); whether they were exhausted
    (the seed's: peak use reached the limit, or an attempt queued); the peak use (reads plus writes, each
    pool's own peak); tickets handed out (at once or to a waiter: ``admitted``), attempts refused one (at
    once, or when their wait ran out: ``refused``) and attempts still waiting at the interval's end
    (``queued``)."""

    returned: int
    exhausted: bool
    peak: int = 0
    admitted: int = 0
    refused: int = 0
    queued: int = 0

    @property
    def turned_away(self) -> int:
        """Attempts the limit did not serve within the interval: refused, or still waiting."""
        return self.refused + self.queued

    @property
    def saturated(self) -> bool:
        """Exhausted, and at least as many attempts turned away as let in: demand at least twice what the
        limit lets through (or tickets held with nothing let in nor asking: a stalled upstream)."""
        return self.exhausted and self.turned_away >= self.admitted


#: Intervals at rest between two tries of a lower target (departure 2): about a second at the default interval.
QUIET = 10


def round_half_up(x: float) -> int:
    """``std::round`` for the non-negative numbers here, as the server rounds (Python's ``round`` goes to even)."""
    return math.floor(x + 0.5)


def split_concurrency(total: int, read_write_ratio: float) -> tuple[int, int]:
    """(read, write) tickets for ``total`` (>= 2): the reads' share rounded, each pool at least one."""
    reads = min(total - 1, max(1, round_half_up(total * read_write_ratio)))
    return reads, total - reads


class ThroughputProber:
    """One endpoint's prober. ``now``: seconds on the caller's monotonic clock. ``read`` and ``write`` are
    the limits the pools enforce (the door)."""

    __slots__ = (
        "spec",
        "state",
        "stable_concurrency",
        "stable_throughput",
        "read",
        "write",
        "quiet",
        "quiet_peak",
        "growing",
        "admitted_avg",
        "turned_away_avg",
        "_last",
    )

    def __init__(self, spec: ProbeSpec, now: float) -> None:
        self.spec = spec
        self.state = ProbeState.STABLE
        self.stable_concurrency = float(spec.initial)
        self.stable_throughput = 0.0
        self.read = 0
        self.write = 0
        self.quiet = 0  # intervals at rest since the pools were exhausted or the target was last tried
        self.quiet_peak = 0  # the highest use during them
        self.growing = False  # the probe up in progress was started by bursts (departure 1)
        self.admitted_avg = 0.0  # tickets handed out per interval, averaged
        self.turned_away_avg = 0.0  # attempts turned away per interval, averaged
        self._last = now
        self.set_concurrency(self.stable_concurrency)

    # -- the seed's helpers --------------------------------------------------------------------------------

    def set_concurrency(self, concurrency: float) -> None:
        self._set_total(self._clamp(round_half_up(concurrency)))

    def _clamp(self, total: int) -> int:
        return min(self.spec.max, max(self.spec.min, total))

    def _set_total(self, total: int) -> None:
        self.read, self.write = split_concurrency(total, self.spec.read_write_ratio)

    def get_current_concurrency(self) -> int:
        return self.read + self.write

    def exponential_moving_average(self, stable_concurrency: float, current_concurrency: float) -> float:
        w = self.spec.ema_weight
        return current_concurrency * w + stable_concurrency * (1 - w)

    def restart(self, now: float) -> None:
        """The next interval starts at ``now`` (the caller did not run the prober while the endpoint was idle:
        an idle stretch measures nothing, and the prober at rest would change nothing)."""
        self._last = now

    @property
    def limits(self) -> tuple[int, int]:
        """(read, write) tickets now: what the pools enforce."""
        return self.read, self.write

    # -- run -----------------------------------------------------------------------------------------------

    def run(self, now: float, interval: Interval) -> ProbeState:
        """One interval ended at ``now``, the pools having seen ``interval``. Sets the new limits
        (:attr:`limits`) and returns the new state. No time elapsed: nothing."""
        elapsed = now - self._last
        if elapsed <= 0:
            return self.state
        self._last = now
        current_throughput = interval.returned / elapsed
        if self.state is ProbeState.STABLE:
            self.probe_stable(current_throughput, interval)
        elif self.state is ProbeState.UP:
            self.probe_up(current_throughput, interval)
        else:
            self.probe_down(current_throughput, interval)
        return self.state

    def _count(self, interval: Interval) -> None:
        """The attempts let in and turned away, averaged over intervals (the seed's EMA weight); an exhausted
        interval ends a quiet spell."""
        w = self.spec.ema_weight
        self.admitted_avg = interval.admitted * w + self.admitted_avg * (1 - w)
        self.turned_away_avg = interval.turned_away * w + self.turned_away_avg * (1 - w)
        if interval.exhausted:
            self.quiet = self.quiet_peak = 0

    def _bursts(self, interval: Interval) -> bool:
        """Exhausted by bursts rather than by overload: the interval was not saturated, and lately fewer than
        one attempt was turned away for every two let in (a load within what the upstream serves has few)."""
        return not interval.saturated and 2 * self.turned_away_avg < self.admitted_avg

    def probe_stable(self, current_throughput: float, interval: Interval) -> None:
        spec = self.spec
        self._count(interval)
        self.stable_throughput = current_throughput
        current_concurrency = self.get_current_concurrency()
        if interval.exhausted and current_concurrency < spec.max:
            self._probe(1 + spec.step, +1)
            self.state = ProbeState.UP
            self.growing = self._bursts(interval)
            if self.growing:
                grown = self._clamp(self._grow(current_concurrency, interval))
                self._set_total(max(grown, self.get_current_concurrency()))
        elif interval.exhausted:
            if interval.saturated and current_concurrency > spec.min:  # at max: the seed's probe down
                self._probe(1 - spec.step, -1)
                self.state = ProbeState.DOWN
            # (bursts at max: only saturation can show that less concurrency gives more throughput)
        else:
            self._rest(interval)

    def probe_up(self, current_throughput: float, interval: Interval) -> None:
        self._count(interval)
        if not self.growing:
            self._settle(current_throughput)
            return
        # A probe up started by bursts goes on up while bursts keep finding the door shut, and is judged
        # when they stop (departure 1).
        current = self.get_current_concurrency()
        spec = self.spec
        if not interval.exhausted:  # the raised limit covered the bursts: keep it
            self.stable_concurrency = float(current)
            self.stable_throughput = current_throughput
        elif self._bursts(interval) and current < spec.max:
            self._set_total(self._clamp(self._grow(current, interval)))
            return
        elif self._bursts(interval) and self.turned_away_avg < spec.step * self.admitted_avg:
            self.stable_concurrency = float(current)  # at max, turning away less than a step's worth: keep it
            self.stable_throughput = current_throughput
        # else saturated (or at max still turning away a step's worth): overload, not bursts; back to stable
        self.growing = False
        self.set_concurrency(self.stable_concurrency)
        self.state = ProbeState.STABLE

    def _grow(self, current: int, interval: Interval) -> int:
        """A probe up through bursts: to what the interval's demand needed (let in and turned away, over let
        in), at least a step (and a ticket)."""
        step = max(current + 1, round_half_up(current * (1 + self.spec.step)))
        if not interval.admitted:
            return step
        demand = interval.admitted + interval.turned_away
        return max(step, round_half_up(current * demand / interval.admitted))

    def probe_down(self, current_throughput: float, interval: Interval) -> None:
        self._count(interval)
        self._settle(current_throughput)

    def _rest(self, interval: Interval) -> None:
        """Not exhausted (departure 2): the door stays. Every ``quiet`` intervals at rest, the seed's probe down
        is tried on the target alone: kept (the seed's EMA) when the highest use of those intervals would
        have had at most half of the target, never below ``initial``."""
        self.quiet += 1
        self.quiet_peak = max(self.quiet_peak, interval.peak)
        if self.quiet < QUIET:
            return
        spec = self.spec
        target = self._probe_total(1 - spec.step, -1)
        if self.stable_concurrency > spec.initial and 2 * self.quiet_peak <= target:
            self.stable_concurrency = max(
                float(spec.initial), self.exponential_moving_average(self.stable_concurrency, target)
            )
            self.set_concurrency(self.stable_concurrency)
        self.quiet = self.quiet_peak = 0

    def _settle(self, current_throughput: float) -> None:
        """The seed's probeUp and probeDown are the same steps: keep what the probe found if throughput rose."""
        if current_throughput > self.stable_throughput:
            self.stable_concurrency = self.exponential_moving_average(
                self.stable_concurrency, self.get_current_concurrency()
            )
            self.stable_throughput = current_throughput
        self.set_concurrency(self.stable_concurrency)
        self.state = ProbeState.STABLE

    def _probe(self, multiple: float, nudge: int) -> None:
        self._set_total(self._probe_total(multiple, nudge))

    def _probe_total(self, multiple: float, nudge: int) -> int:
        """The seed's probe from the stable concurrency, in whole tickets within [min, max]."""
        target = round_half_up(self.stable_concurrency * multiple)
        if target == self.get_current_concurrency():
            target += nudge
        return self._clamp(target)
