"""When a name is resolved again (pure: the caller passes each result in, and ``rand() -> [0, 1)``).

After a resolution that answered (``ok``, or ``empty``: NXDOMAIN, no address), the next comes ``refresh``
later (Envoy's ``dns_refresh_rate``); with ``respect_ttl``, when the answer's TTL ends instead, kept within
[1s, refresh] (a TTL of 0 must not make a fleet query without pause, and a long one must not hide a change
for longer than ``refresh``). After a failed one (a timeout, SERVFAIL, no server), ``failure_refresh``,
doubling with each failure in a row up to ``refresh``. Each delay gets a random 0..``jitter`` on top, so that
a fleet of sidecars started together does not query together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .resolution import ERROR, OK

Rand = Callable[[], float]

#: The shortest wait ``respect_ttl`` allows.
MIN_TTL = 1.0


@dataclass(frozen=True, slots=True)
class RefreshSpec:
    """``upstreams.<name>.dns`` (durations in seconds)."""

    refresh: float = 5.0
    respect_ttl: bool = False
    failure_refresh: float = 1.0
    jitter: float = 1.0


class RefreshSchedule:
    """The waits between resolutions of one name."""

    __slots__ = ("spec", "failures")

    def __init__(self, spec: RefreshSpec) -> None:
        self.spec = spec
        self.failures = 0  # failed resolutions in a row

    def after(self, result: str, ttl: float | None, rand: Rand) -> float:
        """A resolution ended with ``result`` (``ok``, ``empty``, ``error``; ``ttl``: the answer's, in
        seconds): how long until the next one."""
        spec = self.spec
        if result == ERROR:
            self.failures += 1
            wait = min(spec.failure_refresh * 2.0 ** min(self.failures - 1, 32), spec.refresh)
        else:
            self.failures = 0
            wait = spec.refresh
            if spec.respect_ttl and result == OK and ttl is not None:
                wait = min(max(ttl, min(MIN_TTL, spec.refresh)), spec.refresh)
        return wait + rand() * spec.jitter if spec.jitter > 0 else wait
