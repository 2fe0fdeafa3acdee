"""The one answer the client gets for each way a call can end (STYLE habit 10).

| Finish reason | with an upstream status | without one |
| --- | --- | --- |
| ``success``, ``not-retryable``, ``committed`` | the upstream's status, details and trailers | — |
| ``attempts-exhausted``, ``throttled``, ``pushback-no-retry``, ``buffer-exceeded`` | the last upstream status, plus ``grpc-retry-pushback-ms: -1`` (``give_up_pushback``) | ``DEADLINE_EXCEEDED`` if the last attempt hit its per-try timeout |
| ``deadline``, the client's deadline (or the service config's timeout) | ``DEADLINE_EXCEEDED`` "Deadline propagation: Not enough time to handle this call" | same |
| ``deadline``, the sidecar's own bound (the client set none) | the last upstream status, as for a give-up | ``DEADLINE_EXCEEDED`` |
| ``internal-error`` (a sidecar bug, logged) | — | ``INTERNAL`` |
| ``no-endpoint`` | — | ``UNAVAILABLE`` naming the upstream |
| ``cancelled`` | — | ``CANCELLED`` (the client is gone; nobody reads it) |

Every answer after more than one attempt carries ``grpc-previous-rpc-attempts`` in its trailers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from ...policy import Finish, OutcomeClass, Reason
from .metadata import response_metadata, with_give_up_pushback, with_previous_attempts

DEADLINE_DETAILS = "Deadline propagation: Not enough time to handle this call"
_GIVE_UPS = frozenset(
    {
        Reason.ATTEMPTS_EXHAUSTED,
        Reason.THROTTLED,
        Reason.PUSHBACK_NO_RETRY,
        Reason.BUFFER_EXCEEDED,
        Reason.COMMITTED,
        Reason.NO_ENDPOINT,
        Reason.DEADLINE,
    }
)


@dataclass(frozen=True, slots=True)
class UpstreamStatus:
    """How one attempt ended at the upstream: the attempter's payload."""

    code: grpc.StatusCode
    details: str
    trailing: tuple[tuple[str, str | bytes], ...] = ()
    initial: tuple[tuple[str, str | bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class Answer:
    code: grpc.StatusCode
    details: str
    trailing: list[tuple[str, str | bytes]] = field(default_factory=list)


def answer(finish: Finish, status: UpstreamStatus | None, *, upstream: str, give_up_pushback: bool) -> Answer:
    reason = finish.reason
    previous = finish.attempt - 1 if status is not None and finish.attempt else finish.attempts
    if reason is Reason.DEADLINE and not (finish.own_deadline and status is not None):
        code, details, trailing = grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_DETAILS, []
    elif reason is Reason.INTERNAL:
        code, details, trailing = grpc.StatusCode.INTERNAL, "sidecar: internal error (logged)", []
    elif status is not None:
        code, details, trailing = status.code, status.details, response_metadata(status.trailing)
    elif reason is Reason.NO_ENDPOINT:
        code, details, trailing = (
            grpc.StatusCode.UNAVAILABLE,
            f"sidecar: upstream {upstream!r} has no endpoint",
            [],
        )
    elif reason is Reason.CANCELLED:
        code, details, trailing = grpc.StatusCode.CANCELLED, "sidecar: the call was cancelled", []
    elif finish.outcome is not None and finish.outcome.cls is OutcomeClass.TIMEOUT:
        code, details = (
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"sidecar: attempt {finish.attempt} hit its per-try timeout",
        )
        trailing = []
    else:  # an attempt that ended without a status to show (it was abandoned)
        what = finish.outcome.cls.value if finish.outcome is not None else "no answer"
        code, details, trailing = grpc.StatusCode.UNAVAILABLE, f"sidecar: {reason.value} ({what})", []
    if give_up_pushback and reason in _GIVE_UPS and code is not grpc.StatusCode.OK:
        trailing = with_give_up_pushback(trailing)
    return Answer(code, details, with_previous_attempts(trailing, previous))
