"""What the client is told when the sidecar answers itself (pure). One failure, one answer:

=================================  ==============================================================
engine finish                      answer to the client
=================================  ==============================================================
``deadline``, the client's          ``deadline.expired_status`` (498), body ``Deadline expired``,
                                   header ``X-YaTaxi-Deadline-Expired: 1`` (even after an upstream
                                   answer: nobody waits for it any more)
``deadline``, the sidecar's own    the last upstream response, unchanged (its ``Retry-After``
(the client sent none)             included); 504 ``upstream timed out`` when none came
``internal-error``                 500, ``internal error`` (a sidecar bug, logged)
``cancelled`` (client went away)   nothing (there is no one to answer)
any other, an upstream answered    that upstream response, unchanged (status, headers, body)
any other, nobody answered:
  last outcome ``connect-failure``  502, ``upstream connect failure: ...``
  last outcome ``reset``            502, ``upstream reset the connection ...``
  last outcome ``timeout``          504, ``upstream timed out ...``
  ``no-endpoint``                   503, ``no healthy upstream: 'NAME' has no endpoint`` (its names
                                   resolved to no address, or not yet; Envoy's "no healthy upstream")
  anything else                    502, naming the reason
=================================  ==============================================================

Requests the sidecar will not forward (the functions under "Refusals" below: every such status is chosen
here, the connection and the request only write what they are given) get 400 (malformed), 403
(absolute-form to an unknown host or another scheme), 405 (``CONNECT``), 408 (head not received within
``header_timeout`` or ``idle_timeout``), 431 (head larger than ``max_header_size``); each with a short text
body naming the cause. A request whose body stops arriving for ``request_body_timeout`` gets 408 too, and
one whose body breaks its framing 400, its attempts abandoned.

A request admission refuses (:func:`refused`, issue 12) gets 429 when the listener's request rate refused it
and 503 when an endpoint's concurrency did (its ticket queue is full, or the wait is too long); both with
``Retry-After`` (whole seconds, rounded up), and for a rate the IETF ``RateLimit-Policy`` and ``RateLimit``
fields (draft-ietf-httpapi-ratelimit-headers-11: ``"profile";q=500;w=1`` and ``"profile";r=0;t=1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ...admission.reasons import Limiter
from ...admission.refusal import Refusal
from ...policy import Finish, OutcomeClass, Reason
from .headers import phrase

C: Final = OutcomeClass
DEADLINE_BODY: Final = b"Deadline expired"


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = ()


def deadline_expired(status: int) -> Answer:
    return Answer(status, DEADLINE_BODY, ((b"X-YaTaxi-Deadline-Expired", b"1"),))


def for_finish(finish: Finish, expired_status: int, upstream: str = "") -> Answer | None:
    """The sidecar's own answer for ``finish`` when no upstream response is to be delivered (or when the
    deadline overrides it). ``None`` for ``cancelled``: the client is gone. ``upstream``: its name."""
    reason = finish.reason
    if reason is Reason.DEADLINE:
        if finish.own_deadline:
            return text(504, f"upstream timed out (no answer within the sidecar's {reason.value})")
        return deadline_expired(expired_status)
    if reason is Reason.INTERNAL:
        return text(500, "internal error (logged)")
    if reason is Reason.CANCELLED:
        return None
    tries = f" after {finish.attempts} attempt{'s' if finish.attempts != 1 else ''}"
    outcome = finish.outcome
    cls = outcome.cls if outcome is not None else None
    detail = f" ({outcome.detail})" if outcome is not None and outcome.detail else ""
    if cls is C.TIMEOUT:
        return text(504, f"upstream timed out{tries}{detail}")
    if cls is C.CONNECT_FAILURE:
        return text(502, f"upstream connect failure{tries}{detail}")
    if cls is C.RESET:
        return text(502, f"upstream reset the connection{tries}")
    if reason is Reason.NO_ENDPOINT:
        return text(503, f"no healthy upstream: {upstream!r} has no endpoint")
    return text(
        502,
        f"no upstream response{tries} ({reason.value}{', ' + outcome.detail if outcome and outcome.detail else ''})",
    )


def refused(refusal: Refusal) -> Answer:
    """What a client refused by admission is told: 429 (a rate) or 503 (concurrency), when to come back."""
    status = 503 if refusal.limiter is Limiter.CONCURRENCY else 429
    seconds = refusal.retry_after_seconds
    headers: list[tuple[bytes, bytes]] = [(b"Retry-After", b"%d" % seconds)]
    policy = refusal.policy
    if policy is not None:
        name = _sf_string(policy.name)
        headers.append((b"RateLimit-Policy", b"%s;q=%d;w=%d" % (name, policy.quota, policy.window)))
        headers.append((b"RateLimit", b"%s;r=0;t=%d" % (name, seconds)))
    return Answer(status, f"retry-sidecar: {refusal.message}\n".encode(), tuple(headers))


# -- Refusals: requests the sidecar will not forward ---------------------------------------------------
def malformed(detail: object) -> Answer:
    """The parser could not read the request (its message names why)."""
    return text(400, f"malformed request: {detail}")


def unreadable() -> Answer:
    """Reading the request failed inside the sidecar (logged): nothing of it is forwarded."""
    return text(400, "bad request")


def bad_head(detail: str) -> Answer:
    """The head cannot be forwarded as it is: a broken Host, a framing that contradicts itself."""
    return text(400, detail)


def not_chunked(transfer_encoding: str) -> Answer:
    """RFC 9112 6.3: a Transfer-Encoding that does not end in chunked leaves the body's end unknown."""
    return text(400, f"Transfer-Encoding must end in chunked, not {transfer_encoding!r}")


def malformed_target() -> Answer:
    return text(400, "malformed request target")


def not_http_target() -> Answer:
    """An absolute-form target whose scheme is not http (the sidecar forwards plain HTTP requests)."""
    return text(403, "only http:// targets can be proxied")


def not_proxied(host: str, port: int) -> Answer:
    """An absolute-form target that is no upstream of this listener: the sidecar is not an open proxy."""
    return text(403, f"no upstream named or reached at {host}:{port}: the sidecar is not an open proxy")


def connect_method() -> Answer:
    return text(405, "CONNECT tunnels are not supported")


def head_timeout(seconds: float) -> Answer:
    return text(408, f"request head not received within header_timeout ({seconds:g}s)")


def head_idle(seconds: float) -> Answer:
    return text(408, f"request head not received within idle_timeout ({seconds:g}s)")


def head_too_large(limit: int) -> Answer:
    return text(431, f"request head larger than max_header_size ({limit} bytes)")


def body_stalled(seconds: float) -> Answer:
    return text(408, f"request body stalled for request_body_timeout ({seconds:g}s)")


def _sf_string(value: str) -> bytes:
    """``value`` as a structured-field String (RFC 8941 3.3.3): printable ASCII, quoted, ``"`` and ``\\``
    escaped; any other character becomes ``?``."""
    out = []
    for ch in value:
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append("?")
    return ('"' + "".join(out) + '"').encode("ascii")


def text(status: int, message: str) -> Answer:
    return Answer(status, f"retry-sidecar: {message}\n".encode())


def message(answer: Answer) -> str:
    """What ``answer`` says, without the sidecar's prefix (a span's status message)."""
    return answer.body.decode().strip().removeprefix("retry-sidecar: ")


def encode(answer: Answer, keep_alive: bool, head_only: bool = False) -> bytes:
    """The whole HTTP/1.1 response, ready to write."""
    lines = [b"HTTP/1.1 %d %s\r\n" % (answer.status, phrase(answer.status))]
    lines.append(b"Content-Type: text/plain; charset=utf-8\r\n")
    lines.append(b"Content-Length: %d\r\n" % len(answer.body))
    for n, v in answer.headers:
        lines.append(n + b": " + v + b"\r\n")
    if not keep_alive:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    if not head_only:
        lines.append(answer.body)
    return b"".join(lines)
