"""The immutable retry policy, built once from configuration (Envoy's RetryPolicyImpl).

Durations are seconds (floats). ``math.inf`` means "no limit".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from .outcome import OutcomeClass

C: Final = OutcomeClass


class Jitter(StrEnum):
    FULL = "full"  # random(0, d)             (AWS "full jitter", MongoDB, gRPC A6)
    EQUAL = "equal"  # d/2 + random(0, d/2)
    DECORRELATED = "decorrelated"  # min(max, random(initial, previous * multiplier))
    PROPORTIONAL = "proportional"  # d * random(0.8, 1.2)  (gRPC since 2024)
    NONE = "none"  # d


@dataclass(frozen=True, slots=True)
class BackoffSpec:
    """``d_i = min(max, initial * multiplier**i)`` for the i-th backoff wait (i = 0 first), then jitter.

    This is both MongoDB's ``j * min(max, base * 2^i)`` and gRPC A6's
    ``current = min(current * multiplier, max)``: the two sequences are the same numbers.
    """

    initial: float = 0.025
    max: float = 1.0
    multiplier: float = 2.0
    jitter: Jitter = Jitter.FULL

    def __post_init__(self) -> None:
        if self.initial < 0 or self.max < 0:
            raise ValueError("backoff durations must not be negative")
        if self.multiplier < 1:
            raise ValueError("backoff multiplier must be >= 1")


class ThrottleKind(StrEnum):
    GRPC = "grpc"
    MONGODB = "mongodb"


@dataclass(frozen=True, slots=True)
class ThrottleSpec:
    """A retry budget shared by every request to one upstream.

    ``grpc`` (A6): starts at ``max_tokens``; each failed attempt -1, each success +``token_ratio``;
    retries and hedges only while tokens > max_tokens / 2.
    ``mongodb`` (Client Backpressure): starts at ``capacity``; a retry costs ``retry_cost`` or is refused;
    a first-try success deposits ``return_rate``, a success after retries ``return_rate + retry_cost``,
    a retry that fails without the overloaded class deposits ``retry_cost``.
    """

    kind: ThrottleKind
    max_tokens: float = 10.0
    token_ratio: float = 0.1
    capacity: float = 1000.0
    retry_cost: float = 1.0
    return_rate: float = 0.1


@dataclass(frozen=True, slots=True)
class HedgingSpec:
    """Send up to ``max_attempts`` copies, ``delay`` apart; a ``non_fatal`` result sends the next at once."""

    max_attempts: int = 3
    delay: float = 0.05
    non_fatal: frozenset[OutcomeClass] = frozenset({C.UNAVAILABLE, C.OVERLOADED})


DEFAULT_RETRY_ON: Final = frozenset({C.CONNECT_FAILURE, C.RESET, C.UNAVAILABLE, C.OVERLOADED})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Everything the engine needs to decide what follows an attempt.

    ``deadline``: the request deadline used when the client sent none (``inf``: none).
    ``transparent_retry``: A6's transparent retry: the first ``connect-failure`` of a request is retried at
    once, without backoff, without asking or charging the throttle.
    ``deprioritize_overloaded``: an endpoint that answered ``overloaded`` is avoided for the rest of the
    request when any other exists (MongoDB's deprioritized servers).
    """

    name: str = "default"
    max_attempts: int = 3
    retry_on: frozenset[OutcomeClass] = DEFAULT_RETRY_ON
    backoff: BackoffSpec = field(default_factory=BackoffSpec)
    backoff_on: frozenset[OutcomeClass] = DEFAULT_RETRY_ON | {C.TIMEOUT}
    per_try_timeout: float = float("inf")
    pushback: bool = True
    throttle: ThrottleSpec | None = None
    deadline: float = 10.0
    hedging: HedgingSpec | None = None
    transparent_retry: bool = False
    deprioritize_overloaded: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if C.SUCCESS in self.retry_on or C.FATAL in self.retry_on:
            raise ValueError("retry_on cannot contain success or fatal")
        if self.hedging is not None and self.hedging.max_attempts < 1:
            raise ValueError("hedging.max_attempts must be >= 1")
