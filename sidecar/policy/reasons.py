"""Why the engine did what it did. Each decision carries one of these; telemetry records it."""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Reason(StrEnum):
    # an attempt's result is delivered
    SUCCESS = "success"
    NOT_RETRYABLE = "not-retryable"
    # another attempt follows
    RETRY = "retry"
    TRANSPARENT_RETRY = "transparent-retry"
    HEDGE = "hedge"
    AWAIT_HEDGES = "await-hedges"  # this hedge failed, others are still out
    # the request ends without another attempt
    ATTEMPTS_EXHAUSTED = "attempts-exhausted"
    THROTTLED = "throttled"
    DEADLINE = "deadline"
    PUSHBACK_NO_RETRY = "pushback-no-retry"
    COMMITTED = "committed"
    BUFFER_EXCEEDED = "buffer-exceeded"
    NO_ENDPOINT = "no-endpoint"
    CANCELLED = "cancelled"  # the client went away
    INTERNAL = "internal-error"  # a bug in the sidecar ended this request (and only this one)
    # why an attempt was cancelled
    PER_TRY_TIMEOUT = "per-try-timeout"
    HEDGE_LOST = "hedge-lost"


#: Reasons that end a request having given up on a failure (as opposed to delivering a success).
GIVE_UPS: Final = frozenset(
    {
        Reason.NOT_RETRYABLE,
        Reason.ATTEMPTS_EXHAUSTED,
        Reason.THROTTLED,
        Reason.DEADLINE,
        Reason.PUSHBACK_NO_RETRY,
        Reason.COMMITTED,
        Reason.BUFFER_EXCEEDED,
        Reason.NO_ENDPOINT,
        Reason.CANCELLED,
        Reason.INTERNAL,
    }
)
