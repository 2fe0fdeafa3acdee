"""HTTP results in the engine's words (pure): a response head or a transport failure -> :class:`Outcome`.

* a response carrying ``X-YaTaxi-Deadline-Expired`` -> ``timeout`` (with ``deadline_expired``), whatever its
  status: it is never a body to pass on (userver deadline propagation);
* a status in ``overload_status`` -> ``overloaded`` (503 is in both lists by default: overloaded wins);
* a status in ``retryable_status`` -> ``unavailable``;
* other 5xx -> ``fatal``; anything below 500 -> ``success`` (a 404 is the upstream's answer, not a failure).
Pushback (``Retry-After``, ``pushback_header``) is read on ``overloaded`` and ``unavailable`` answers.
Transport failures: refused/DNS/connect timeout, a TLS handshake cut short -> ``connect-failure``; a TLS
handshake that failed for a reason no retry mends (the server's certificate does not verify, the server
refused the handshake) -> ``fatal``: a configuration problem, answered 502 naming it and never retried into
a storm; the connection broke before any response byte -> ``reset``. Per-try timeouts are the engine's own
(it cancels the attempt).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ...config import PolicyConfig
from ...policy import Outcome, OutcomeClass
from .headers import DEADLINE_EXPIRED_HEADER, STRIDE, VALUE, Headers
from .pushback import pushback

C: Final = OutcomeClass
_RETRY_AFTER: Final = b"retry-after"

_SUCCESS_BY_STATUS: Final[dict[int, Outcome]] = {}


@dataclass(frozen=True, slots=True)
class HttpClassifier:
    """A policy's HTTP classification keys, ready to use on every response."""

    overload: frozenset[int]
    retryable: frozenset[int]
    pushback_header: bytes | None

    @classmethod
    def from_policy(cls, cfg: PolicyConfig) -> HttpClassifier:
        header = cfg.pushback_header.lower().encode("latin-1") if cfg.pushback_header else None
        return cls(frozenset(cfg.overload_status), frozenset(cfg.retryable_status), header)

    def response(self, status: int, headers: Headers, now_wall: float) -> Outcome:
        """Classify a response head. ``now_wall``: the wall clock (for ``Retry-After`` dates)."""
        overload = status in self.overload
        if not overload and status not in self.retryable and status < 500:
            # The common case first; a success still turns into a timeout if the upstream says so.
            expired = _deadline_expired(headers)
            if not expired:
                return _success(status)
            return Outcome(C.TIMEOUT, deadline_expired=True, detail=f"{status} deadline expired")
        retry_after = millis = None
        expired = False
        pb_name = self.pushback_header
        for i in range(0, len(headers), STRIDE):
            low = headers[i]
            value = headers[i + VALUE]
            if low == _RETRY_AFTER:
                retry_after = value
            elif low == DEADLINE_EXPIRED_HEADER and value.strip():
                expired = True
            elif pb_name is not None and low == pb_name:
                millis = value
        if expired:
            return Outcome(C.TIMEOUT, deadline_expired=True, detail=f"{status} deadline expired")
        if overload:
            cls = C.OVERLOADED
        elif status in self.retryable:
            cls = C.UNAVAILABLE
        else:
            return Outcome(C.FATAL, detail=str(status))
        hint = (
            pushback(retry_after, millis, now_wall) if retry_after is not None or millis is not None else None
        )
        return Outcome(cls, pushback=hint, detail=str(status))


def _deadline_expired(headers: Headers) -> bool:
    for i in range(0, len(headers), STRIDE):
        if headers[i] == DEADLINE_EXPIRED_HEADER and headers[i + VALUE].strip():
            return True
    return False


def _success(status: int) -> Outcome:
    o = _SUCCESS_BY_STATUS.get(status)
    if o is None:
        o = _SUCCESS_BY_STATUS[status] = Outcome(C.SUCCESS, detail=str(status))
    return o


# -- transport failures -----------------------------------------------------------------------------------
#: The deadline had passed by the time the request could be written: a timeout, nothing was sent.
NO_TIME: Final = Outcome(C.TIMEOUT, detail="no time left to send")


def connect_failure(detail: str) -> Outcome:
    """No connection could be made (refused, DNS, connect timeout): nothing reached the upstream."""
    return Outcome(C.CONNECT_FAILURE, detail=detail or "connect failed")


def connect_failed(detail: str, configuration: bool) -> Outcome:
    """No connection could be made (``upstream.ConnectFailed``): a ``connect-failure``, or, when the TLS
    handshake failed for a reason another try cannot change (``configuration``), ``fatal``: the request
    ends on it at once, answered 502 with ``detail`` (``answer.for_finish``)."""
    if configuration:
        return Outcome(C.FATAL, detail=detail)
    return connect_failure(detail)


def reset(detail: str) -> Outcome:
    """The connection broke before any byte of the response (after the request, or part of it, went out)."""
    return Outcome(C.RESET, detail=detail or "connection reset before the response")
