"""What an attempt came back with, in the engine's words.

Outcomes are immutable records (``NamedTuple``, cheap to build: one per attempt).
Every protocol adapter maps its results (an HTTP status, a gRPC status, a MongoDB error document, a
socket error) into an :class:`Outcome`. The engine never sees a protocol type: only these classes and hints.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, NamedTuple


class OutcomeClass(StrEnum):
    SUCCESS = "success"
    CONNECT_FAILURE = "connect-failure"  # the request never reached the upstream
    RESET = "reset"  # the connection broke before any response byte
    TIMEOUT = "timeout"  # the per-try timeout fired (or the upstream said its deadline expired)
    UNAVAILABLE = "unavailable"
    OVERLOADED = "overloaded"
    FATAL = "fatal"  # a final answer that is not a success: passed to the client, never retried


class Pushback(NamedTuple):
    """A server's hint about retrying: wait ``delay`` seconds, or (``delay is None``) do not retry at all."""

    delay: float | None

    @property
    def stop(self) -> bool:
        return self.delay is None


PUSHBACK_STOP: Final = Pushback(None)


class Outcome(NamedTuple):
    """The classified result of one attempt.

    ``deadline_expired``: the upstream said the request's deadline expired (userver's header, MongoDB's
    MaxTimeMSExpired to a request whose maxTimeMS we set).
    ``backoff_base``: a server-sent base for the backoff formula, replacing the policy's ``initial`` for the
    rest of this request (MongoDB's ``baseBackoffMS``).
    ``prefer_previous``: should this outcome end the request, deliver the previous attempt's response
    instead (MongoDB's ``NoWritesPerformed``: the earlier error says more).
    ``overload``: the upstream signalled overload although the class says otherwise (a MongoDB error
    labelled ``SystemOverloadedError`` that is not retryable, a connection refused by an ingress rate
    limiter): the endpoint is avoided as for ``overloaded`` and the ``mongodb`` bucket refunds nothing.
    ``local``: the sidecar refused the attempt itself (no concurrency ticket): nothing reached the endpoint,
    so it says nothing of the endpoint's health (outlier detection does not count it); the endpoint is
    still avoided as for ``overloaded`` (it is at its limit).
    ``detail``: a short protocol-level label for telemetry only ("503", "UNAVAILABLE", "code 462").
    """

    cls: OutcomeClass
    pushback: Pushback | None = None
    deadline_expired: bool = False
    backoff_base: float | None = None
    prefer_previous: bool = False
    detail: str = ""
    overload: bool = False
    local: bool = False

    @property
    def ok(self) -> bool:
        return self.cls is OutcomeClass.SUCCESS


SUCCESS: Final = Outcome(OutcomeClass.SUCCESS)
