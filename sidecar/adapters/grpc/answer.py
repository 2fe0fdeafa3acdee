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
| ``not-retryable``: a second request message on a ``unary_requests`` method | ``INTERNAL`` naming the setting (:func:`second_message`) | — |

Every answer after more than one attempt carries ``grpc-previous-rpc-attempts`` in its trailers.

A call admission refuses (:func:`refused`, issue 12: the listener's request rate, or an endpoint's ticket
queue) ends with ``RESOURCE_EXHAUSTED``, details naming the limiter, and ``grpc-retry-pushback-ms`` set to
the wait for the next token (A6: a client that retries ``RESOURCE_EXHAUSTED`` waits that long; ``0`` when
the wait is not known).

The response headers of the attempt that answers (:func:`response_headers`) are the upstream's, with
``grpc-previous-rpc-attempts`` after a retry or hedge. Writing all of it to the client is ``downstream.py``'s.
Pure: no I/O, no asyncio.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc

from ...admission.refusal import Refusal
from ...policy import Finish, OutcomeClass, Reason
from .classify import UpstreamStatus
from .metadata import PUSHBACK, response_metadata, with_give_up_pushback, with_previous_attempts

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


#: What an attempt that lost its client ends with (nobody reads it; the span records it).
CLIENT_GONE_STATUS = UpstreamStatus(grpc.StatusCode.CANCELLED, "client gone")


def second_message(method: str) -> UpstreamStatus:
    """What a call ends with when its client sent a second request message on a method the listener's
    ``unary_requests`` lists: ``INTERNAL``, naming the setting (the upstream never serves half a request
    as whole)."""
    return UpstreamStatus(
        grpc.StatusCode.INTERNAL,
        f"sidecar: the client sent a second request message on {method}, which the listener's "
        "unary_requests lists as taking one: remove it from unary_requests",
    )


def refused(refusal: Refusal, previous: int = 0) -> Answer:
    """What a call refused by admission ends with: ``RESOURCE_EXHAUSTED`` and when to come back.
    ``previous``: attempts made before the refused one (an endpoint's ticket refused on a retry), told in
    ``grpc-previous-rpc-attempts`` as for every answer after more than one attempt."""
    return Answer(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"retry-sidecar: {refusal.message}",
        with_previous_attempts([(PUSHBACK, str(refusal.retry_after_ms))], previous),
    )


def response_headers(initial: Any, attempt: int) -> tuple[tuple[str, str | bytes], ...]:
    """The response headers the client gets from attempt ``attempt``: the upstream's (``initial``), and
    after a retry or hedge ``grpc-previous-rpc-attempts``. Empty: they go out with the first message."""
    return tuple(with_previous_attempts(response_metadata(initial or ()), attempt - 1))
