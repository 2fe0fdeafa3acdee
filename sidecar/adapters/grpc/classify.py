"""gRPC status -> outcome class (pure). Configured from the policy's ``retryable_codes`` and
``overload_codes``.

| what came back | class |
| --- | --- |
| ``OK`` | ``success`` |
| ``UNAVAILABLE`` from a connection that never reached the upstream (refused, no address, refused stream) | ``connect-failure`` |
| ``UNAVAILABLE`` from a connection that broke during the call (reset, socket closed, GOAWAY) | ``reset`` |
| ``DEADLINE_EXCEEDED`` | ``timeout`` (marked ``deadline_expired`` when the attempt carried a deadline) |
| a code in ``retryable_codes`` (default ``UNAVAILABLE``) | ``unavailable`` |
| a code in ``overload_codes`` (default ``RESOURCE_EXHAUSTED``) | ``overloaded`` |
| ``RESOURCE_EXHAUSTED`` "... larger than max ..." (a message over a size limit) | ``fatal`` |
| any other code | ``fatal`` |
| the sidecar ended the attempt: another attempt answered first (``LOST``), the client is gone (``CLIENT_GONE``), a second request message on a ``unary_requests`` method (``SECOND_MESSAGE``) | ``fatal`` |

A non-OK status may carry A6 server pushback (``grpc-retry-pushback-ms``). What came back is an
:class:`UpstreamStatus`: the attempt's payload, which ``answer.py`` turns into the client's status.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import grpc

from ...config.schema import GRPC_CODES
from ...policy import SUCCESS, Outcome, OutcomeClass
from .metadata import parse_pushback

C = OutcomeClass
CODE_BY_NAME = {c.name: c for c in grpc.StatusCode}
#: Each code's number (``StatusCode.value[0]`` is an enum property, looked up in Python on every read).
CODE_NUMBER: dict[grpc.StatusCode, int] = {c: c.value[0] for c in grpc.StatusCode}

#: The attempts the sidecar ends itself (never retried: each is the end of its call or of a lost hedge).
LOST = Outcome(C.FATAL, detail="another attempt answered first")
CLIENT_GONE = Outcome(C.FATAL, detail="client gone")
SECOND_MESSAGE = Outcome(C.FATAL, detail="second request message on a unary_requests method")

# Transport errors that grpc core reports as UNAVAILABLE, recognised by their details text.
_NEVER_SENT = (
    "failed to connect to all addresses",
    "connection refused",
    "failed to connect to remote host",
    "connect failed",
    "dns resolution failed",
    "name resolution failure",
    "empty address list",
    "no addresses",
    "rst_stream with error code 7",  # REFUSED_STREAM: the server did not start processing it
    "stream refused",
)
_BROKEN = (
    "socket closed",
    "connection reset",
    "broken pipe",
    "stream removed",
    "goaway",
    "connection aborted",
    "end of tcp stream",
    "keepalive watchdog timeout",
    "recvmsg",
    "sendmsg",
)


class UpstreamStatus:
    """How one attempt ended at the upstream: the attempter's payload. (A plain class: made per attempt,
    compiled; ``sidecar/native.py``.)"""

    __slots__ = ("code", "details", "trailing", "initial")

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        trailing: tuple[tuple[str, str | bytes], ...] = (),
        initial: tuple[tuple[str, str | bytes], ...] = (),
    ) -> None:
        self.code = code
        self.details = details
        self.trailing = trailing
        self.initial = initial


@dataclass(frozen=True, slots=True)
class GrpcClassifier:
    retryable: frozenset[grpc.StatusCode]
    overload: frozenset[grpc.StatusCode]

    @classmethod
    def from_names(cls, retryable: Iterable[str], overload: Iterable[str]) -> GrpcClassifier:
        return cls(
            frozenset(CODE_BY_NAME[n] for n in retryable), frozenset(CODE_BY_NAME[n] for n in overload)
        )

    def classify(
        self,
        code: grpc.StatusCode,
        details: str | None,
        trailing: Iterable[tuple[str, str | bytes]] = (),
        *,
        responded: bool = False,
        had_deadline: bool = False,
    ) -> Outcome:
        """``responded``: the upstream sent headers or a message first (so the transport did reach it).
        ``had_deadline``: the attempt carried a ``grpc-timeout``."""
        if code is grpc.StatusCode.OK:
            return SUCCESS
        pushback = parse_pushback(trailing)
        label = code.name
        if code is grpc.StatusCode.UNAVAILABLE and not responded and details:
            text = details.lower()
            if any(p in text for p in _NEVER_SENT):
                return Outcome(C.CONNECT_FAILURE, pushback=pushback, detail=label)
            if any(p in text for p in _BROKEN):
                return Outcome(C.RESET, pushback=pushback, detail=label)
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return Outcome(C.TIMEOUT, pushback=pushback, deadline_expired=had_deadline, detail=label)
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED and details and "larger than max" in details:
            return Outcome(C.FATAL, pushback=pushback, detail="message too large")  # not an overload
        if code in self.retryable:
            return Outcome(C.UNAVAILABLE, pushback=pushback, detail=label)
        if code in self.overload:
            return Outcome(C.OVERLOADED, pushback=pushback, detail=label)
        return Outcome(C.FATAL, pushback=pushback, detail=label)


def status_code(name: str) -> grpc.StatusCode:
    return CODE_BY_NAME[name]


assert set(GRPC_CODES) == set(CODE_BY_NAME), "the config's code names and grpcio's must agree"
