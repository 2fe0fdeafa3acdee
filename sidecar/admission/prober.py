"""The seed's throughput probing, verbatim where it is precise (``mongodb-server-admission-control.md``,
"Throughput Probing": the pseudocode and its diagram), run every ``interval`` by the caller:

    run()          throughput := tickets returned / time elapsed; then by state:
    probeStable    record the throughput; below max and tickets exhausted: probe up (stable x (1 + step));
                   else above min: probe down (stable x (1 - step)); else (at min) no change
    probeUp        throughput increased: stable := EMA(stable, current), record the throughput;
    probeDown      either way set the stable concurrency and go back to stable

with ``EMA(stable, current) = current x ema_weight + stable x (1 - ema_weight)``.

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
            raise ValueError(f"initial ({self.initial!r}) must be within min and max ([{self.min}, {self.max}])")
        if not 0.0 <= self.read_write_ratio <= 1.0:
            raise ValueError(f"read_write_ratio must be within [0, 1], not {self.read_write_ratio!r}")
        if not 0.0 < self.step < 1.0:
            raise ValueError(f"step must be within (0, 1), not {self.step!r}")
        if not 0.0 < self.ema_weight <= 1.0:
            raise ValueError(f"ema_weight must be within (0, 1], not {self.ema_weight!r}")


def round_half_up(x: float) -> int:
    """``std::round`` for the non-negative numbers here, as the server rounds (Python's ``round`` goes to even)."""
    return math.floor(x + 0.5)


def split_concurrency(total: int, read_write_ratio: float) -> tuple[int, int]:
    """(read, write) tickets for ``total`` (>= 2): the reads' share rounded, each pool at least one."""
    reads = min(total - 1, max(1, round_half_up(total * read_write_ratio)))
    return reads, total - reads


class ThroughputProber:
    """One endpoint's prober. ``now``: seconds on the caller's monotonic clock."""

    __slots__ = ("spec", "state", "stable_concurrency", "stable_throughput", "read", "write", "_last")

    def __init__(self, spec: ProbeSpec, now: float) -> None:
        self.spec = spec
        self.state = ProbeState.STABLE
        self.stable_concurrency = float(spec.initial)
        self.stable_throughput = 0.0
        self.read = 0
        self.write = 0
        self._last = now
        self.set_concurrency(self.stable_concurrency)

    # -- the seed's helpers --------------------------------------------------------------------------------

    def set_concurrency(self, concurrency: float) -> None:
        spec = self.spec
        self._set_total(min(spec.max, max(spec.min, round_half_up(concurrency))))

    def _set_total(self, total: int) -> None:
        self.read, self.write = split_concurrency(total, self.spec.read_write_ratio)

    def get_current_concurrency(self) -> int:
        return self.read + self.write

    def exponential_moving_average(self, stable_concurrency: float, current_concurrency: float) -> float:
        w = self.spec.ema_weight
        return current_concurrency * w + stable_concurrency * (1 - w)

    def restart(self, now: float) -> None:
        """The next interval starts at ``now`` (the caller did not run the prober while the endpoint was idle:
        an idle stretch measures nothing, as the seed's prober would find running it, see ``probe_stable``)."""
        self._last = now

    @property
    def limits(self) -> tuple[int, int]:
        """(read, write) tickets now."""
        return self.read, self.write

    # -- run -----------------------------------------------------------------------------------------------

    def run(self, now: float, tickets_returned: int, exhausted: bool) -> ProbeState:
        """One interval ended at ``now``: ``tickets_returned`` by both pools during it, and whether they were
        exhausted. Sets the new limits (:attr:`limits`) and returns the new state. No time elapsed: nothing."""
        elapsed = now - self._last
        if elapsed <= 0:
            return self.state
        self._last = now
        current_throughput = tickets_returned / elapsed
        if self.state is ProbeState.STABLE:
            self.probe_stable(current_throughput, exhausted)
        elif self.state is ProbeState.UP:
            self.probe_up(current_throughput)
        else:
            self.probe_down(current_throughput)
        return self.state

    def probe_stable(self, current_throughput: float, exhausted: bool) -> None:
        spec = self.spec
        self.stable_throughput = current_throughput
        current_concurrency = self.get_current_concurrency()
        if current_concurrency < spec.max and exhausted:
            self._probe(1 + spec.step, +1)
            self.state = ProbeState.UP
        elif current_concurrency > spec.min:
            self._probe(1 - spec.step, -1)
            self.state = ProbeState.DOWN
        # else: at the minimum and not exhausted, no change

    def probe_up(self, current_throughput: float) -> None:
        self._settle(current_throughput)

    def probe_down(self, current_throughput: float) -> None:
        self._settle(current_throughput)

    def _settle(self, current_throughput: float) -> None:
        """probeUp and probeDown are the same steps: keep what the probe found if throughput rose."""
        if current_throughput > self.stable_throughput:
            self.stable_concurrency = self.exponential_moving_average(
                self.stable_concurrency, self.get_current_concurrency()
            )
            self.stable_throughput = current_throughput
        self.set_concurrency(self.stable_concurrency)
        self.state = ProbeState.STABLE

    def _probe(self, multiple: float, nudge: int) -> None:
        spec = self.spec
        current = self.get_current_concurrency()
        target = round_half_up(self.stable_concurrency * multiple)
        if target == current:
            target += nudge
        self._set_total(min(spec.max, max(spec.min, target)))
