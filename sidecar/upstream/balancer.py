"""Endpoint choice: power of two choices by outstanding requests, avoiding overloaded and ejected endpoints.

Pure: the clock (``now``) and randomness (``rand() -> [0, 1)``) come in as arguments.

Endpoints are ranked, and the choice is made among the best rank only:
  0. not ejected by outlier detection (``outlier.py``: it kept failing),
  1. not in the request's deprioritized set (it answered ``overloaded`` to this request),
  2. not in its overload cooldown (it answered ``overloaded`` to anyone in the last ``cooldown`` seconds),
  3. not yet tried by this request (hedges go to distinct endpoints; retries prefer a fresh one).
So "retry elsewhere when anywhere else exists" holds, and with a single endpoint it is simply used.
A request's first attempt goes to an ejected endpoint whose ejection time is up, once: the probe that
returns it to the rotation (or ejects it again).

The set of endpoints changes (:meth:`Balancer.update`: a name resolved again, a reload): an endpoint that
stays keeps its state (outstanding attempts, cooldown, ejection); a new one starts fresh; one that left gets
no new attempt (not even a probe) and *drains*: once its last outstanding attempt finished,
``on_drained(endpoint)`` tells its owner, who closes its connections (``upstream/discovery.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Final

from ..policy.engine import EndpointPicker
from ..policy.outcome import OutcomeClass
from .outlier import OutlierDetector, OutlierSpec

Rand = Callable[[], float]

#: An endpoint's state (``sidecar_upstream_endpoints{state}``, ``/config``).
ACTIVE: Final = "active"
EJECTED: Final = "ejected"
DRAINING: Final = "draining"


class Balancer(EndpointPicker):
    __slots__ = (
        "endpoints",
        "cooldown",
        "outstanding",
        "outliers",
        "draining",
        "on_drained",
        "_penalized_until",
    )

    def __init__(
        self, endpoints: Sequence[str], cooldown: float = 5.0, outliers: OutlierSpec | None = None
    ) -> None:
        """``outliers``: eject endpoints that keep failing (``None``: never)."""
        self.endpoints: list[str] = list(endpoints)
        self.cooldown = cooldown
        self.outstanding: dict[str, int] = {e: 0 for e in self.endpoints}
        self.outliers: OutlierDetector | None = OutlierDetector(outliers) if outliers is not None else None
        self._penalized_until: dict[str, float] = {}
        #: Endpoints that left the set with attempts still outstanding (a dict used as an ordered set).
        self.draining: dict[str, None] = {}
        #: Told of an endpoint that left the set once nothing is outstanding on it.
        self.on_drained: Callable[[str], None] | None = None

    # -- the set ---------------------------------------------------------------------------------------
    def update(self, endpoints: Sequence[str]) -> list[str]:
        """``endpoints`` is the set from now on; the endpoints that left it are returned (each drains)."""
        new = list(dict.fromkeys(endpoints))
        keep = set(new)
        left = [e for e in self.endpoints if e not in keep]
        self.endpoints = new
        outstanding = self.outstanding
        for e in new:
            if e not in outstanding:
                outstanding[e] = 0
            self.draining.pop(e, None)  # back before its drain ended: it keeps what it had
        for e in left:
            self._penalized_until.pop(e, None)
            if self.outliers is not None:
                self.outliers.forget(e)
            if outstanding.get(e, 0) > 0:
                self.draining[e] = None
            else:
                self._drained(e)
        return left

    def reconfigure(self, cooldown: float, outliers: OutlierSpec | None) -> None:
        """A reload changed the upstream's settings: its endpoints keep their state under the new ones."""
        self.cooldown = cooldown
        if outliers is None:
            self.outliers = None
        elif self.outliers is None:
            self.outliers = OutlierDetector(outliers)
        else:
            self.outliers.spec = outliers

    def state(self, endpoint: str) -> str:
        """:data:`ACTIVE`, :data:`EJECTED` or :data:`DRAINING` (an endpoint gone for good: ``""``)."""
        if endpoint in self.draining:
            return DRAINING
        od = self.outliers
        if od is not None and endpoint in od.ejected:
            return EJECTED
        return ACTIVE if endpoint in self.endpoints else ""

    def _drained(self, endpoint: str) -> None:
        self.draining.pop(endpoint, None)
        self.outstanding.pop(endpoint, None)
        told = self.on_drained
        if told is not None:
            told(endpoint)

    # -- accounting, called by the engine -------------------------------------------------------------
    def started(self, endpoint: str) -> None:
        self.outstanding[endpoint] = self.outstanding.get(endpoint, 0) + 1

    def finished(self, endpoint: str) -> None:
        n = self.outstanding.get(endpoint, 0)
        self.outstanding[endpoint] = n - 1 if n > 0 else 0
        if n <= 1 and self.draining and endpoint in self.draining:
            self._drained(endpoint)

    def penalize(self, endpoint: str, now: float) -> None:
        if self.cooldown > 0:
            self._penalized_until[endpoint] = now + self.cooldown

    def observe(self, endpoint: str, outcome: OutcomeClass, now: float) -> None:
        od = self.outliers
        if od is not None:
            od.observe(endpoint, outcome, now, len(self.endpoints))

    def alternative(self, endpoint: str, candidates: Sequence[str] | None) -> bool:
        pool = self.endpoints if candidates is None else candidates
        ejected = self.outliers.ejected if self.outliers is not None else {}
        return any(e != endpoint and e not in ejected for e in pool)

    def cooldown_until(self, endpoint: str) -> float:
        """When ``endpoint``'s overload cooldown ends, on the loop's clock (read by the console); it may have
        passed already (0.0 when none was ever set)."""
        return self._penalized_until.get(endpoint, 0.0)

    def penalized(self, endpoint: str, now: float) -> bool:
        until = self._penalized_until.get(endpoint)
        if until is None:
            return False
        if now >= until:
            del self._penalized_until[endpoint]
            return False
        return True

    # -- choice ---------------------------------------------------------------------------------------
    def pick(
        self,
        now: float,
        rand: Rand,
        candidates: Sequence[str] | None = None,
        avoid: Collection[str] = (),
        deprioritized: Collection[str] = (),
    ) -> str | None:
        pool = self.endpoints if candidates is None else candidates
        n = len(pool)
        if n == 0:
            return None
        if n == 1:
            return pool[0]
        od = self.outliers
        ejected = od.ejected if od is not None else None
        if ejected and od is not None and not avoid:
            probe = od.probe(now, pool)
            if probe is not None:
                return probe
        if avoid or deprioritized or self._penalized_until or ejected:
            best_rank = 16
            tier: list[str] = []
            for e in pool:
                rank = (
                    (8 if ejected and e in ejected else 0)
                    + (4 if e in deprioritized else 0)
                    + (2 if self.penalized(e, now) else 0)
                    + (1 if e in avoid else 0)
                )
                if rank < best_rank:
                    best_rank = rank
                    tier = [e]
                elif rank == best_rank:
                    tier.append(e)
            pool = tier
            n = len(pool)
            if n == 1:
                return pool[0]
        i = int(rand() * n) % n
        j = int(rand() * (n - 1)) % (n - 1)
        if j >= i:
            j += 1
        a, b = pool[i], pool[j]
        out = self.outstanding
        return b if out.get(b, 0) < out.get(a, 0) else a
