"""Every way a command can end, as the one reply the app gets; and the documents the sidecar writes itself
(its ``hello`` as a mongos, its errors, an upstream error with the retry labels taken off).

How each way a request ends becomes the app's answer (``Finish.reason`` -> reply):

=====================================  =========================================================================
success, not-retryable, attempts-      the delivered attempt's reply (the previous attempt's when the last one
exhausted, throttled, pushback-no-     said ``NoWritesPerformed``), with ``RetryableError``/``RetryableWriteError``
retry                                  removed unless ``final_error_labels: keep``; a failure without a reply
                                       becomes the sidecar's error document (below)
deadline (the app's maxTimeMS), the    that error (a backoff would have crossed the deadline, or the upstream
last attempt's own error               said its maxTimeMS expired)
deadline (the policy's default: the    the last reply received, whichever attempt gave it
app sent no maxTimeMS), a reply came
deadline, otherwise                    code 50 MaxTimeMSExpired (the deadline passed before any attempt, or
                                       while one was out)
internal-error                         code 1 InternalError (a sidecar bug, logged)
no-endpoint                            code 133 FailedToSatisfyReadPreference naming what each server is
cancelled                              nothing (the app went away)
=====================================  =========================================================================

Error codes the sidecar uses (none of them makes a driver retry by code; 462's labels do):

=====================================================  ====  ================================  ==========================
when                                                   code  codeName                          labels
=====================================================  ====  ================================  ==========================
the deadline (maxTimeMS) passed before an answer        50   MaxTimeMSExpired
no server fits the command (no primary, no secondary)   133  FailedToSatisfyReadPreference
no connection to the upstream could be made             133  FailedToSatisfyReadPreference     SystemOverloadedError
the upstream connection broke after the command went    9001 SocketException
the upstream refused the sidecar's credentials          18   AuthenticationFailed
the app tried to authenticate to the sidecar            18   AuthenticationFailed
a command whose maxTimeMS cannot be set                 2    BadValue
a bug in the sidecar while it carried the command        1    InternalError
admission refused the command (request rate, tickets)   462  IngressRequestRateLimitExceeded   SystemOverloadedError,
                                                                                               RetryableError
=====================================================  ====  ================================  ==========================

A refusal (:func:`refusal_doc`, issue 12) has the shape a MongoDB 8.2 server's ingress request rate limiter
gives, so that a driver with client backpressure (pymongo 4.17+) backs off and retries by itself; its errmsg
names the limiter and when a token is next free. A full ticket queue toward an upstream gets the same.

``RetryableError`` (and, for retryable writes, ``RetryableWriteError``) are added only with
``final_error_labels: keep``; in a transaction every network error carries ``TransientTransactionError``.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import bson
from bson import CodecOptions
from bson.raw_bson import RawBSONDocument

from ...admission.refusal import Refusal
from ...policy import Reason
from ...runtime import Delivery
from . import wire
from .classify import OVERLOADED_LABEL, RETRYABLE_LABEL, RETRYABLE_WRITE_LABEL, Failure, labels_of
from .commands import Command
from .topology import Topology

_KEEP_TYPES = CodecOptions(document_class=dict, tz_aware=True)
STRIPPED = frozenset({RETRYABLE_LABEL, RETRYABLE_WRITE_LABEL})
TRANSIENT = "TransientTransactionError"


def error_doc(code: int, code_name: str, errmsg: str, labels: list[str] | tuple[str, ...] = ()) -> bytes:
    doc: dict[str, Any] = {"ok": 0.0, "errmsg": errmsg, "code": code, "codeName": code_name}
    if labels:
        doc["errorLabels"] = list(labels)
    return bson.encode(doc)


def deadline_doc(cmd: Command) -> bytes:
    return error_doc(
        50, "MaxTimeMSExpired", f"operation exceeded time limit ({cmd.max_time_ms} ms maxTimeMS)"
    )


def no_server_doc(message: str) -> bytes:
    return error_doc(133, "FailedToSatisfyReadPreference", message)


def failure_doc(failure: Failure, cmd: Command, upstream: str, attempts: int, keep: bool) -> bytes:
    tried = f" after {attempts} attempt{'s' if attempts != 1 else ''}"
    labels: list[str] = []
    if failure.stage == "auth":
        return error_doc(18, "AuthenticationFailed", f"upstream {upstream!r}: {failure.message}")
    if failure.stage == "request":
        return error_doc(2, "BadValue", failure.message)
    if cmd.in_transaction:
        labels.append(TRANSIENT)
    if failure.stage == "connect":
        labels.append(OVERLOADED_LABEL)
        if keep:
            labels.append(RETRYABLE_LABEL)
        msg = f"retry-sidecar could not reach upstream {upstream!r}{tried}: {failure.message}"
        return error_doc(133, "FailedToSatisfyReadPreference", msg, labels)
    if keep and cmd.retryable_write:
        labels.append(RETRYABLE_WRITE_LABEL)
    msg = f"connection to upstream {upstream!r} broke{tried}: {failure.message}"
    return error_doc(9001, "SocketException", msg, labels)


def refusal_doc(refusal: Refusal) -> bytes:
    """The error a command refused by admission gets (code 462, overloaded and retryable)."""
    return error_doc(
        462,
        "IngressRequestRateLimitExceeded",
        f"retry-sidecar: {refusal.message}",
        (OVERLOADED_LABEL, RETRYABLE_LABEL),
    )


def without_retry_labels(body: RawBSONDocument) -> bytes | None:
    """The body without ``RetryableError``/``RetryableWriteError``, or ``None`` when it has neither."""
    labels = body.get("errorLabels")
    if not isinstance(labels, list) or not any(x in STRIPPED for x in labels):
        return None
    doc = bson.decode(body.raw, _KEEP_TYPES)
    kept = [x for x in labels if x not in STRIPPED]
    if kept:
        doc["errorLabels"] = kept
    else:
        del doc["errorLabels"]
    return bson.encode(doc)


def hello_reply(request: Mapping[str, Any], facts: Mapping[str, Any], connection_id: int) -> bytes:
    """The sidecar's answer to ``hello``/``isMaster``: a mongos with the upstream's limits, no
    ``topologyVersion`` (so drivers poll instead of streaming), no compression, no auth mechanisms."""
    legacy = "hello" not in request
    doc: dict[str, Any] = {"ismaster" if legacy else "isWritablePrimary": True}
    if request.get("helloOk"):
        doc["helloOk"] = True
    doc["msg"] = "isdbgrid"
    doc.update(
        maxBsonObjectSize=facts["maxBsonObjectSize"],
        maxMessageSizeBytes=facts["maxMessageSizeBytes"],
        maxWriteBatchSize=facts["maxWriteBatchSize"],
        localTime=datetime.datetime.now(datetime.UTC),
        connectionId=connection_id,
        minWireVersion=facts["minWireVersion"],
        maxWireVersion=facts["maxWireVersion"],
        readOnly=False,
    )
    if facts.get("logicalSessionTimeoutMinutes") is not None:
        doc["logicalSessionTimeoutMinutes"] = facts["logicalSessionTimeoutMinutes"]
    doc["ok"] = 1.0
    return bson.encode(doc)


def ok_doc() -> bytes:
    return bson.encode({"ok": 1.0})


def for_finish(
    topology: Topology, upstream: str, keep_labels: bool, cmd: Command, msg: wire.Msg, delivery: Delivery
) -> tuple[bytes | None, str | None]:
    """The body to send the app, and the error (for the request span) if it is not a success.
    ``keep_labels``: the policy's ``final_error_labels: keep``."""
    f = delivery.finish
    payload = delivery.payload
    if f.reason is Reason.CANCELLED or msg.more_to_come:
        return None, None if f.reason is Reason.SUCCESS else f.reason.value
    if f.reason is Reason.DEADLINE and (
        payload is None or not f.own_deadline and (f.attempt is None or f.attempt != f.attempts)
    ):
        return deadline_doc(cmd), "deadline"
    if f.reason is Reason.INTERNAL:
        return error_doc(1, "InternalError", "retry-sidecar: internal error (logged)"), "internal-error"
    if f.reason is Reason.NO_ENDPOINT:
        return no_server_doc(topology.describe_unselectable(cmd.read_preference)), "no-endpoint"
    if payload is None:  # the attempt failed inside the sidecar (logged by the runtime)
        detail = f.outcome.detail if f.outcome is not None else f.reason.value
        return error_doc(1, "InternalError", f"retry-sidecar: {detail}"), detail
    retried_by_sidecar = not cmd.in_transaction
    strip = retried_by_sidecar and not keep_labels
    if isinstance(payload, Failure):
        doc = failure_doc(payload, cmd, upstream, f.attempts, keep=not strip)
        return doc, f.outcome.detail if f.outcome is not None else payload.message
    body = payload.msg.body
    if strip and labels_of(payload.body):
        body = without_retry_labels(payload.body) or body
    error = (
        None
        if f.reason is Reason.SUCCESS
        else (f.outcome.detail if f.outcome is not None else f.reason.value)
    )
    return body, error
