"""A request as the listener read it: method, target, version, headers in order, and its body (if any)."""

from __future__ import annotations

from typing import Final

from .headers import Headers
from .replay import RequestBody

IDEMPOTENT: Final = frozenset({b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE", b"TRACE"})


class IncomingRequest:
    __slots__ = (
        "began",
        "method",
        "url",
        "version",
        "headers",
        "keep_alive",
        "body",
        "expect_continue",
        "head_size",
        "refusal",
        "head_request",
        "zero_length",
    )

    def __init__(self, began: float) -> None:
        self.began = began  # loop time when its first byte arrived: deadlines count from here
        self.method = b""
        self.url = b""
        self.version = "1.1"
        self.headers: Headers = []  # flat: lowercased name, name, value (headers.Headers)
        self.keep_alive = True
        self.body: RequestBody | None = None
        self.expect_continue = False
        self.head_size = 0
        self.refusal: tuple[int, str] | None = None  # answer this instead of forwarding (400, 405, ...)
        self.head_request = False  # a HEAD request: its answer has no body (set with ``method``)
        self.zero_length = False  # no body, and the client said so (``Content-Length: 0``): forwarded as such

    @property
    def idempotent(self) -> bool:
        return self.method in IDEMPOTENT

    @property
    def body_complete(self) -> bool:
        return self.body is None or self.body.complete


def refused(began: float, status: int, message: str) -> IncomingRequest:
    """A placeholder in the connection's queue for an answer the sidecar gives itself (then closes)."""
    r = IncomingRequest(began)
    r.refusal = (status, message)
    r.keep_alive = False
    return r
