"""Admission control, the pure core: the seed's token bucket (``RateLimiter``), its throughput prober and
per-endpoint ticket pools (``mongodb-server-admission-control.md``).

Like ``sidecar.policy``, nothing here touches a socket, asyncio, a protocol or the wall clock: time comes in
as ``now`` (seconds on any monotonic clock) and each call returns a decision the caller carries out (admit,
wait until a given time, reject with a reason and when to come back).
"""

from .bucket import RateLimiter
from .concurrency import EndpointConcurrency
from .decision import Decision, Verdict
from .prober import Interval, ProbeSpec, ProbeState, ThroughputProber, split_concurrency
from .reasons import Count, Limiter, Rejection
from .refusal import RatePolicy, Refusal
from .stats import AdmissionStats
from .tickets import Kind, TicketPool, TicketPools

__all__ = [
    "AdmissionStats",
    "Count",
    "Decision",
    "EndpointConcurrency",
    "Interval",
    "Kind",
    "Limiter",
    "ProbeSpec",
    "ProbeState",
    "RateLimiter",
    "RatePolicy",
    "Refusal",
    "Rejection",
    "ThroughputProber",
    "TicketPool",
    "TicketPools",
    "Verdict",
    "split_concurrency",
]
