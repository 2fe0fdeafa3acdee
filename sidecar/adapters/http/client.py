"""An upstream connection: an asyncio Protocol parsing responses with httptools (llhttp), one exchange at
a time (no upstream pipelining). Pooled per endpoint by ``pool.py``.

An exchange: ``start(head, body)`` writes the request head and pushes the body (see ``replay.py``) and
returns a future for the response head; the :class:`UpstreamResponse` then collects or streams the body.
Whoever owns the exchange hands the connection back with :meth:`UpstreamConnection.release` once it is
done with the response; only a connection whose request and response both ended cleanly is reused.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httptools

from .replay import RequestBody
from .response import UpstreamResponse

if TYPE_CHECKING:
    from .pool import Pool

#: Hold at most this much of an undelivered response body before pausing the upstream socket.
HOLD_LIMIT = 256 * 1024
_NO_BODY_STATUS = frozenset({204, 304})


class UpstreamGone(Exception):
    """The connection failed before a complete response head arrived (``reset``)."""

    def __init__(self, detail: str, got_bytes: bool) -> None:
        super().__init__(detail)
        self.detail = detail
        self.got_bytes = got_bytes


class ConnectFailed(Exception):
    """No connection could be made (refused, DNS, connect timeout): nothing was sent."""

    def __init__(self, detail: str, timeout: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.timeout = timeout


class UpstreamConnection(asyncio.Protocol):
    __slots__ = (
        "pool",
        "transport",
        "parser",
        "parser_dirty",
        "closed",
        "idle_since",
        "waiter",
        "response",
        "head_request",
        "got_bytes",
        "reason",
        "headers",
        "informational",
        "body",
        "request_done",
        "cork",
        "attempt",
        "reading_paused",
        "last_activity",
        "keep_alive",
    )

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.parser_dirty = False
        self.closed = False
        self.idle_since = 0.0
        self.last_activity = 0.0
        self.waiter: asyncio.Future[UpstreamResponse] | None = None
        self.response: UpstreamResponse | None = None
        self.head_request = False
        self.got_bytes = False
        self.reason = b""
        self.headers: list[tuple[bytes, bytes, bytes]] = []
        self.informational = False
        self.body: RequestBody | None = None
        self.request_done = True
        self.cork: list[bytes] | None = None
        self.attempt = 0
        self.reading_paused = False
        self.keep_alive = False  # the upstream's word on the last response (llhttp forgets it once done)

    # -- the exchange --------------------------------------------------------------------------------
    def start(
        self, head: bytes, body: RequestBody | None, head_request: bool, attempt: int
    ) -> asyncio.Future[UpstreamResponse]:
        """Send a request; the future gets the response head (or :class:`UpstreamGone`)."""
        assert self.transport is not None and self.response is None and self.waiter is None
        if self.parser_dirty:
            self.parser = httptools.HttpResponseParser(self)
            self.parser_dirty = False
        self.waiter = self.pool.loop.create_future()
        self.head_request = head_request
        self.attempt = attempt
        self.got_bytes = False
        self.headers = []
        self.reason = b""
        if body is None:
            self.request_done = True
            self.transport.write(head)
        else:
            self.request_done = False
            self.body = body
            self.cork = [head]
            try:
                body.attach(self)
            finally:
                out, self.cork = self.cork, None
            self.transport.write(b"".join(out))
        return self.waiter

    def release(self) -> None:
        """The owner is done with this exchange: back to the pool if it ended cleanly, else closed."""
        if self.waiter is None:
            return  # the exchange already ended and the connection went back by itself
        r = self.response
        reusable = (
            not self.closed
            and self.request_done
            and r is not None
            and r.complete
            and r.error is None
            and self.keep_alive
        )
        self._detach_body()
        self.response = None
        self.waiter = None
        if reusable:
            if self.reading_paused:
                self.reading_paused = False
                self.transport.resume_reading()  # type: ignore[union-attr]
            self.pool.release(self)
        else:
            self.abort()

    def abandon(self, waiter: asyncio.Future[UpstreamResponse]) -> None:
        """The attempt that sent ``waiter``'s request gives up: drop the connection if it still serves it."""
        if self.waiter is waiter:
            self.abort()

    def _exchange_over(self) -> None:
        """Request sent and response complete: a clean exchange needs nobody to hand the connection back."""
        r = self.response
        if r is None or not self.request_done or not self.keep_alive or self.closed or r.error is not None:
            return
        r.conn = None
        self.response = None
        self.waiter = None
        self.body = None
        self.pool.release(self)

    def abort(self) -> None:
        """Drop the connection now (a cancelled attempt, a broken exchange)."""
        self._detach_body()
        if not self.closed:
            self.closed = True
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.abort()

    def _detach_body(self) -> None:
        if self.body is not None:
            self.body.detach(self)
            self.body = None

    # -- the request body (replay.BodySink) ----------------------------------------------------------
    def body_data(self, data: bytes) -> None:
        assert self.body is not None
        parts = [b"%x\r\n" % len(data), data, b"\r\n"] if self.body.chunked else [data]
        if self.cork is not None:
            self.cork.extend(parts)
        elif not self.closed:
            self.transport.writelines(parts)  # type: ignore[union-attr]

    def body_end(self) -> None:
        assert self.body is not None
        if self.body.chunked:
            if self.cork is not None:
                self.cork.append(b"0\r\n\r\n")
            elif not self.closed:
                self.transport.write(b"0\r\n\r\n")  # type: ignore[union-attr]
        self.request_done = True
        self.body = None
        r = self.response
        if r is not None and r.complete:
            self._exchange_over()

    # -- flow control ----------------------------------------------------------------------------------
    def pause_writing(self) -> None:
        if self.body is not None:
            self.body.sink_paused(self)

    def resume_writing(self) -> None:
        if self.body is not None:
            self.body.sink_resumed(self)

    def pause_reading(self) -> None:
        if not self.reading_paused and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]

    def resume_reading(self) -> None:
        if self.reading_paused and not self.closed:
            self.reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]

    # -- asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # bytes while idle in the pool: the upstream is confused; drop it
            self.abort()
            return
        self.got_bytes = True
        self.last_activity = self.pool.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._broken(f"malformed upstream response: {e}")

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        was_closed = self.closed
        self.closed = True
        if not was_closed:
            self.pool.forget(self)
        r = self.response
        if self.waiter is not None and not self.waiter.done():
            why = "connection reset" if exc is not None else "connection closed"
            self.waiter.set_exception(UpstreamGone(f"{why} before the response", self.got_bytes))
        elif r is not None and not r.complete and r.error is None:
            if r.close_delimited and exc is None:
                r.finished()
            else:
                r.failed("upstream connection lost mid-body")
        self._detach_body()

    def _broken(self, why: str) -> None:
        r = self.response
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(UpstreamGone(why, True))
        elif r is not None and not r.complete:
            r.failed(why)
        self.abort()

    # -- httptools callbacks ---------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.reason = b""
        self.headers = []

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is None:  # after the head come trailers: not forwarded
            self.headers.append((name.lower(), name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            if status == 101:
                raise httptools.HttpParserError("the upstream switched protocols unasked")
            self.informational = True  # 100 Continue, 103 Early Hints: not forwarded
            return
        self.informational = False
        self.keep_alive = self.parser.should_keep_alive()
        length: int | None = None
        chunked = False
        for low, _, value in self.headers:
            if low == b"content-length":
                length = int(value)
            elif low == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if chunked:
            length = None
        no_body = self.head_request or status in _NO_BODY_STATUS
        r = UpstreamResponse(status, self.reason, self.headers, length, chunked, no_body, self, self.attempt)
        self.response = r
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(r)
        if self.head_request:
            # llhttp would wait for Content-Length bytes that never come after HEAD: use a new parser next time.
            self.parser_dirty = True
            self._exchange_over()

    def on_body(self, body: bytes) -> None:
        r = self.response
        if r is None or r.no_body:
            return
        r.body(body)
        if r.pipe is None and r.held > HOLD_LIMIT:
            self.pause_reading()

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        r = self.response
        if r is not None:
            if not r.complete:
                r.finished()
            self._exchange_over()
