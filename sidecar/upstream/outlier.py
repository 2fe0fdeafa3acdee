"""Outlier detection: endpoints that keep failing leave the rotation for a while, and come back by probe.

Pure and clock-driven (``now`` comes in with every call), modelled on Envoy's ``outlier_detection``:

- each endpoint counts CONSECUTIVE failures of three kinds, with no good answer in between: connect
  failures (``connect-failure``: nothing was sent), errors (``unavailable``, ``overloaded``, ``reset``: the
  5xx / overload / broken-connection family) and timeouts (``timeout``: per-try timeouts included). An
  answer (``success``, or a ``fatal`` one: the endpoint is alive and answering) resets all three;
- when a count reaches its threshold the endpoint is ejected for ``base_ejection_time`` x the number of
  times it was ejected, capped at ``max_ejection_time``; the count of ejections starts again once an
  endpoint has stayed in the rotation for ``max_ejection_time`` after its return;
- ``max_ejection_percent`` of an upstream's endpoints at most are ejected at once, but always at least one
  when there are two or more, and never the last one (Envoy's rule, plus a floor: a single endpoint is
  never ejected: there would be nowhere else to go);
- return by probe (linkerd's failure accrual, where Envoy returns on time alone): when an ejected
  endpoint's time is up, it gets ONE request (:meth:`OutlierDetector.probe`); its answer returns it, a
  failure ejects it again for longer. A probe that never reports (its attempt was cancelled) is given up
  after ``base_ejection_time``, and the next request probes again.

Results that arrive for an ejected endpoint that is not being probed (attempts sent before the ejection)
are ignored. The balancer ranks ejected endpoints last, so an ejected endpoint gets no first attempts
while any endpoint in rotation exists.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from ..policy.outcome import OutcomeClass

INF: Final = math.inf
_SUCCESS: Final = OutcomeClass.SUCCESS
_FATAL: Final = OutcomeClass.FATAL
_CONNECT_FAILURE: Final = OutcomeClass.CONNECT_FAILURE
_TIMEOUT: Final = OutcomeClass.TIMEOUT

#: Why an endpoint was ejected: the label of ``sidecar_ejections_total{reason}``.
CONNECT_FAILURES: Final = "consecutive-connect-failures"
ERRORS: Final = "consecutive-errors"
TIMEOUTS: Final = "consecutive-timeouts"
PROBE_FAILED: Final = "probe-failed"
REASONS: Final = (CONNECT_FAILURES, ERRORS, TIMEOUTS, PROBE_FAILED)


class OutlierSpec:
    """The settings (``upstreams.<name>.outlier_detection``), immutable."""

    __slots__ = (
        "consecutive_connect_failures",
        "consecutive_errors",
        "consecutive_timeouts",
        "base_ejection_time",
        "max_ejection_time",
        "max_ejection_percent",
    )

    def __init__(
        self,
        consecutive_connect_failures: int = 3,
        consecutive_errors: int = 5,
        consecutive_timeouts: int = 5,
        base_ejection_time: float = 5.0,
        max_ejection_time: float = 60.0,
        max_ejection_percent: float = 50.0,
    ) -> None:
        self.consecutive_connect_failures = consecutive_connect_failures
        self.consecutive_errors = consecutive_errors
        self.consecutive_timeouts = consecutive_timeouts
        self.base_ejection_time = base_ejection_time
        self.max_ejection_time = max_ejection_time
        self.max_ejection_percent = max_ejection_percent

    def __repr__(self) -> str:
        return (
            f"OutlierSpec(connect={self.consecutive_connect_failures}, errors={self.consecutive_errors}, "
            f"timeouts={self.consecutive_timeouts}, base={self.base_ejection_time}, "
            f"max={self.max_ejection_time}, max_percent={self.max_ejection_percent})"
        )


class Health:
    """One endpoint's record: its consecutive failure counts and its ejection."""

    __slots__ = ("connect", "errors", "timeouts", "until", "probing", "times", "returned_at")

    def __init__(self) -> None:
        self.connect = 0
        self.errors = 0
        self.timeouts = 0
        self.until = -INF  # ejected until (or, while probing, until another probe may go)
        self.probing = False
        self.times = 0  # how many times ejected (the multiplier of the ejection time)
        self.returned_at = -INF


class OutlierDetector:
    """The outlier state of one upstream's endpoints. The balancer reports every attempt's result
    (:meth:`observe`), asks for a due probe (:meth:`probe`) and ranks :attr:`ejected` endpoints last."""

    __slots__ = ("spec", "ejected", "ejections", "_health")

    def __init__(self, spec: OutlierSpec) -> None:
        self.spec = spec
        #: The endpoints out of the rotation now (probing ones included), with their records.
        self.ejected: dict[str, Health] = {}
        #: Ejections so far, by reason (read by telemetry).
        self.ejections: dict[str, int] = {}
        self._health: dict[str, Health] = {}

    def is_ejected(self, endpoint: str) -> bool:
        return endpoint in self.ejected

    def observe(self, endpoint: str, cls: OutcomeClass, now: float, total: int) -> None:
        """An attempt to ``endpoint`` ended with ``cls``; the upstream has ``total`` endpoints."""
        health = self._health
        if cls is _SUCCESS or cls is _FATAL:
            if not health:  # nothing ever failed: the common case, one test
                return
            h = health.get(endpoint)
            if h is None:
                return
            if endpoint in self.ejected:
                if h.probing:
                    self._return(endpoint, h, now)
                return
            h.connect = h.errors = h.timeouts = 0
            return
        h = health.get(endpoint)
        if h is None:
            h = health[endpoint] = Health()
        if endpoint in self.ejected:
            if h.probing:
                self._eject(endpoint, h, now, PROBE_FAILED)
            return
        spec = self.spec
        if cls is _CONNECT_FAILURE:
            h.connect += 1
            reason = CONNECT_FAILURES if h.connect >= spec.consecutive_connect_failures else ""
        elif cls is _TIMEOUT:
            h.timeouts += 1
            reason = TIMEOUTS if h.timeouts >= spec.consecutive_timeouts else ""
        else:  # unavailable, overloaded, reset
            h.errors += 1
            reason = ERRORS if h.errors >= spec.consecutive_errors else ""
        if reason and self._may_eject(total):
            self._eject(endpoint, h, now, reason)

    def forget(self, endpoint: str) -> None:
        """``endpoint`` left the upstream's set: its record goes (if it comes back, it starts afresh)."""
        self.ejected.pop(endpoint, None)
        self._health.pop(endpoint, None)

    def probe(self, now: float, pool: Sequence[str]) -> str | None:
        """An ejected endpoint of ``pool`` whose time is up, now marked as probing (the caller sends it one
        request), or ``None``."""
        for endpoint, h in self.ejected.items():
            if h.until <= now and endpoint in pool:
                h.probing = True
                h.until = now + self.spec.base_ejection_time
                return endpoint
        return None

    # -- the steps ----------------------------------------------------------------------------------
    def _may_eject(self, total: int) -> bool:
        if total <= 1:
            return False
        allowed = max(1, int(total * self.spec.max_ejection_percent / 100.0))
        after = len(self.ejected) + 1
        return after <= allowed and after < total

    def _eject(self, endpoint: str, h: Health, now: float, reason: str) -> None:
        spec = self.spec
        if h.times and endpoint not in self.ejected and now - h.returned_at >= spec.max_ejection_time:
            h.times = 0  # it stayed healthy long enough: the next ejection is a first one again
        h.times += 1
        h.until = now + min(spec.base_ejection_time * h.times, spec.max_ejection_time)
        h.probing = False
        h.connect = h.errors = h.timeouts = 0
        self.ejected[endpoint] = h
        self.ejections[reason] = self.ejections.get(reason, 0) + 1

    def _return(self, endpoint: str, h: Health, now: float) -> None:
        del self.ejected[endpoint]
        h.probing = False
        h.until = -INF
        h.returned_at = now
        h.connect = h.errors = h.timeouts = 0
