"""An upstream's answer (a reply document, or a failure to get one) -> the engine's :class:`Outcome`.

Pure. The class depends on the error and on the command (see ``commands.py`` for the retry rules):

========================================================  ==================  =================================
what came back                                            class               extras
========================================================  ==================  =================================
``ok: 1`` (write errors included: they are answers)        success
``ok: 1`` + ``RetryableWriteError`` to a retryable write   unavailable         (a retryable writeConcernError)
``SystemOverloadedError`` + ``RetryableError``             overloaded          ``baseBackoffMS`` -> backoff base
``SystemOverloadedError`` + a classic retryable error      overloaded
``RetryableError``                                         unavailable
``RetryableWriteError`` to a retryable write               unavailable
a retryable read error code to a retryable read            unavailable
"not primary" (10107, 13435, 10058) to any command       unavailable         refused before it ran
``MaxTimeMSExpired`` (50) to a command with maxTimeMS      timeout             deadline expired upstream
anything else                                              fatal               passed to the app unchanged
connection or handshake to the upstream failed             connect-failure     nothing was sent
the connection broke after the command was sent            reset / fatal       reset only if retryable read/write
the sidecar could not prepare the command (``maxTimeMS``)   fatal
a message that wants no reply (``moreToCome``) went out     success
========================================================  ==================  =================================

Some errors also say the server is no longer what monitoring thinks (not primary, shutting down):
:func:`server_changed`, after which the attempt marks it unknown.

``NoWritesPerformed`` on any failure sets ``prefer_previous``: if the request ends on it, the app gets the
error of the attempt before (the Retryable Writes rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...policy import Outcome, OutcomeClass
from .commands import Command

C = OutcomeClass

OVERLOADED_LABEL = "SystemOverloadedError"
RETRYABLE_LABEL = "RetryableError"
RETRYABLE_WRITE_LABEL = "RetryableWriteError"
NO_WRITES_LABEL = "NoWritesPerformed"

#: Retryable Reads: the codes a read is retried on (not-primary, shutdown, network-ish).
RETRYABLE_READ_CODES = frozenset(
    {11600, 11602, 10107, 13435, 13436, 189, 91, 7, 6, 89, 9001, 262, 134, 10058}
)
MAX_TIME_EXPIRED = 50
#: "not primary": the server refused the command before running it, so any command may go elsewhere.
NOT_PRIMARY_CODES = frozenset({10107, 13435, 10058})
#: Codes after which the server is no longer what the topology thinks (not primary, shutting down).
STATE_CHANGE_CODES = frozenset({10107, 13435, 13436, 189, 11602, 10058, 91, 11600})


@dataclass(frozen=True, slots=True)
class Failure:
    """No reply: ``stage`` is ``connect`` (connect, TLS, handshake: nothing was sent), ``auth`` (the
    upstream refused the sidecar's credentials), ``network`` (broke after the command was sent) or
    ``request`` (the sidecar could not prepare the command)."""

    stage: str
    message: str


def labels_of(doc: Mapping[str, Any]) -> tuple[str, ...]:
    labels = doc.get("errorLabels")
    if isinstance(labels, list):
        return tuple(x for x in labels if isinstance(x, str))
    return ()


def is_ok(doc: Mapping[str, Any]) -> bool:
    ok = doc.get("ok")
    return ok is True or (isinstance(ok, int | float) and not isinstance(ok, bool) and ok == 1)


def classify_reply(doc: Mapping[str, Any], cmd: Command, max_time_sent: bool) -> Outcome:
    labels = labels_of(doc)
    if is_ok(doc):
        if labels and cmd.retryable_write and RETRYABLE_WRITE_LABEL in labels:
            return Outcome(C.UNAVAILABLE, detail="writeConcernError (RetryableWriteError)")
        return Outcome(C.SUCCESS)
    code = doc.get("code")
    code = code if isinstance(code, int) and not isinstance(code, bool) else None
    name = doc.get("codeName")
    detail = f"code {code}" + (f" {name}" if isinstance(name, str) else "") if code is not None else "ok: 0"
    prefer_previous = NO_WRITES_LABEL in labels
    if code == MAX_TIME_EXPIRED and max_time_sent:
        return Outcome(C.TIMEOUT, deadline_expired=True, prefer_previous=prefer_previous, detail=detail)
    retryable = RETRYABLE_LABEL in labels
    classic = (
        (cmd.retryable_write and RETRYABLE_WRITE_LABEL in labels)
        or (cmd.retryable_read and code in RETRYABLE_READ_CODES)
        or (code in NOT_PRIMARY_CODES and not cmd.in_transaction)
    )
    if OVERLOADED_LABEL in labels and (retryable or classic):
        return Outcome(
            C.OVERLOADED, backoff_base=_base_backoff(doc), prefer_previous=prefer_previous, detail=detail
        )
    if retryable or classic:
        return Outcome(C.UNAVAILABLE, prefer_previous=prefer_previous, detail=detail)
    return Outcome(
        C.FATAL, prefer_previous=prefer_previous, detail=detail, overload=OVERLOADED_LABEL in labels
    )


def classify_sent() -> Outcome:
    """A message that wants no reply (``moreToCome``) went out whole: that is its success."""
    return Outcome(C.SUCCESS)


def server_changed(code: object) -> bool:
    """An error ``code`` that says the server is no longer what monitoring thinks."""
    return code in STATE_CHANGE_CODES


def classify_failure(failure: Failure, cmd: Command) -> Outcome:
    if failure.stage == "request":
        return Outcome(C.FATAL, detail=failure.message)
    if failure.stage == "connect":
        # Drivers label a refused or dropped connection attempt SystemOverloadedError (an ingress
        # connection rate limiter closes it before the handshake): the same here.
        return Outcome(C.CONNECT_FAILURE, detail=f"connect: {failure.message}", overload=True)
    if failure.stage == "auth":
        return Outcome(C.FATAL, detail=f"auth: {failure.message}")
    if cmd.retryable_read or cmd.retryable_write:
        return Outcome(C.RESET, detail=f"network: {failure.message}")
    return Outcome(C.FATAL, detail=f"network: {failure.message}")


def _base_backoff(doc: Mapping[str, Any]) -> float | None:
    """The server's ``baseBackoffMS`` (2026 revision of Client Backpressure), in seconds."""
    v = doc.get("baseBackoffMS")
    if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0:
        return float(v) / 1000.0
    return None
