"""Endpoint choice: power of two choices by outstanding requests, avoiding overloaded endpoints.

Pure: the clock (``now``) and randomness (``rand() -> [0, 1)``) come in as arguments.

Endpoints are ranked, and the choice is made among the best rank only:
  1. not in the request's deprioritized set (it answered ``overloaded`` to this request),
  2. not in its overload cooldown (it answered ``overloaded`` to anyone in the last ``cooldown`` seconds),
  3. not yet tried by this request (hedges go to distinct endpoints; retries prefer a fresh one).
So "retry elsewhere when anywhere else exists" holds, and with a single endpoint it is simply used.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from ..policy.engine import EndpointPicker

Rand = Callable[[], float]


class Balancer(EndpointPicker):
    __slots__ = ("endpoints", "cooldown", "outstanding", "_penalized_until")

    def __init__(self, endpoints: Sequence[str], cooldown: float = 5.0) -> None:
        self.endpoints: list[str] = list(endpoints)
        self.cooldown = cooldown
        self.outstanding: dict[str, int] = {e: 0 for e in self.endpoints}
        self._penalized_until: dict[str, float] = {}

    def set_endpoints(self, endpoints: Sequence[str]) -> None:
        """Replace the endpoint list (e.g. a replica set's members changed); counts carry over."""
        self.endpoints = list(endpoints)
        for e in self.endpoints:
            self.outstanding.setdefault(e, 0)

    # -- accounting, called by the engine -------------------------------------------------------------
    def started(self, endpoint: str) -> None:
        self.outstanding[endpoint] = self.outstanding.get(endpoint, 0) + 1

    def finished(self, endpoint: str) -> None:
        n = self.outstanding.get(endpoint, 0)
        self.outstanding[endpoint] = n - 1 if n > 0 else 0

    def penalize(self, endpoint: str, now: float) -> None:
        if self.cooldown > 0:
            self._penalized_until[endpoint] = now + self.cooldown

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
        if avoid or deprioritized or self._penalized_until:
            best_rank = 8
            tier: list[str] = []
            for e in pool:
                rank = (
                    (4 if e in deprioritized else 0)
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
