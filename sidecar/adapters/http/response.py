"""An upstream response on its way to the client: the head as soon as it is parsed, then the body.

Until it is delivered (the engine chose it) the body is held in memory as it arrives (for a retried or
discarded answer this is a small error body); once delivered, what was held goes out at once and the
rest is written through to the client as it arrives, with the client's flow control reaching back to the
upstream socket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .headers import Headers

if TYPE_CHECKING:
    from .client import UpstreamConnection


class Pipe(Protocol):
    """Where a delivered response's body goes (the client connection)."""

    def data(self, chunk: bytes) -> None: ...
    def end(self) -> None: ...
    def abort(self, why: str) -> None: ...


class UpstreamResponse:
    __slots__ = (
        "status",
        "reason",
        "headers",
        "length",
        "chunked",
        "no_body",
        "chunks",
        "held",
        "complete",
        "error",
        "pipe",
        "conn",
        "attempt",
    )

    def __init__(
        self,
        status: int,
        reason: bytes,
        headers: Headers,
        length: int | None,
        chunked: bool,
        no_body: bool,
        conn: UpstreamConnection,
        attempt: int,
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.length = length  # declared Content-Length (None when chunked or close-delimited)
        self.chunked = chunked
        self.no_body = no_body  # HEAD, 1xx, 204, 304
        self.chunks: list[bytes] = []
        self.held = 0
        self.complete = no_body
        self.error: str | None = None
        self.pipe: Pipe | None = None
        self.conn: UpstreamConnection | None = (
            conn  # None once the exchange ended and the connection went back
        )
        self.attempt = attempt

    @property
    def close_delimited(self) -> bool:
        """The body ends when the upstream closes the connection (no length, not chunked)."""
        return not self.no_body and not self.chunked and self.length is None

    # -- from the upstream connection ----------------------------------------------------------------
    def body(self, chunk: bytes) -> None:
        if self.pipe is not None:
            self.pipe.data(chunk)
        else:
            self.chunks.append(chunk)
            self.held += len(chunk)

    def finished(self) -> None:
        self.complete = True
        if self.pipe is not None:
            self.pipe.end()

    def failed(self, why: str) -> None:
        self.error = why
        if self.pipe is not None:
            self.pipe.abort(why)

    # -- from the exchange ---------------------------------------------------------------------------
    def release(self) -> None:
        """Done with this response: its connection goes back to the pool if the exchange ended cleanly."""
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.release()

    def abort(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.abort()

    def pause_upstream(self) -> None:
        if self.conn is not None:
            self.conn.pause_reading()

    def resume_upstream(self) -> None:
        if self.conn is not None:
            self.conn.resume_reading()

    def take_held(self) -> list[bytes]:
        chunks, self.chunks, self.held = self.chunks, [], 0
        return chunks
