"""The upstream side of HTTP: connections to the endpoints, the responses they read, and the pools that keep
them (one file, so that the three, which refer to each other, are one unit with no import circle).

Connections. An upstream connection: an asyncio Protocol parsing responses with httptools (llhttp), one
exchange at a time (no upstream pipelining). Pooled per endpoint by :class:`Pool`.

An exchange: ``start(head, body, ..., exchange)`` writes the request head and pushes the body (see
``replay.py``); the exchange is told ``on_response(response)`` once the response head has arrived (after the
packet that carried it was parsed whole, so a small response is complete by then), or ``on_gone(error)``
when the connection fails first. The :class:`UpstreamResponse` then collects or streams the body. A
connection whose request and response both ended cleanly goes back to its pool by itself; whoever holds one
otherwise hands it back with :meth:`UpstreamConnection.release` (an exchange not ended cleanly closes it).
Its :class:`State` changes only through its own methods, and there is one road back to the pool
(``UpstreamConnection._back``).

Responses. An upstream response on its way to the client: the head as soon as it is parsed, then the body.

Until it is delivered (the engine chose it) the body is held in memory as it arrives (for a retried or
discarded answer this is a small error body); once delivered, what was held goes out at once and the
rest is written through to the client as it arrives, with the client's flow control reaching back to the
upstream socket.

Pools. Keep-alive connections to one upstream endpoint (one address), at most ``max_connections`` at a
time; :class:`EndpointPools` holds one upstream's pools, one per address, and drains an address that left the
upstream's set (``upstream/discovery.py``): its pool closes, so idle connections go at once, busy ones once
their exchange ends, and no new one is made.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from enum import IntEnum
from typing import Final, Protocol

import httptools
from mypy_extensions import mypyc_attr

from ..transitions import InvalidTransition
from .headers import CHUNKED, Headers, add_header, body_framing
from .replay import RequestBody


# -- responses -------------------------------------------------------------------------------------------
class Pipe(Protocol):
    """Where a delivered response's body goes (the request it answers, ``request.Forwarding``): set and
    cleared only by the response itself (``stream_to``; its end, break or abort)."""

    def response_data(self, chunk: bytes) -> None: ...
    def response_end(self) -> None: ...
    def response_broke(self, why: str) -> None: ...


class UpstreamResponse:
    __slots__ = (
        "status",
        "reason",
        "headers",
        "length",
        "chunked",
        "no_body",
        "keep_alive",
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
        keep_alive: bool,
        conn: UpstreamConnection,
        attempt: int,
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.length = length  # declared Content-Length (None when chunked or close-delimited)
        self.chunked = chunked
        self.no_body = no_body  # HEAD, 1xx, 204, 304
        self.keep_alive = keep_alive  # the upstream's word: its connection may carry another exchange
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
            self.pipe.response_data(chunk)
        else:
            self.chunks.append(chunk)
            self.held += len(chunk)

    def finished(self) -> None:
        self.complete = True
        pipe, self.pipe = self.pipe, None
        if pipe is not None:
            pipe.response_end()

    def failed(self, why: str) -> None:
        """The body broke off (or the sidecar gave up on it: a client's idle timeout)."""
        self.error = why
        pipe, self.pipe = self.pipe, None
        if pipe is not None:
            pipe.response_broke(why)

    # -- from the exchange ---------------------------------------------------------------------------
    def stream_to(self, pipe: Pipe) -> None:
        """Delivered: the rest of the body goes to ``pipe`` as it comes, then its end or its break."""
        self.pipe = pipe

    def release(self) -> None:
        """Done with this response: its connection goes back to the pool if the exchange ended cleanly."""
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.release()

    def abort(self) -> None:
        """Given up (the client went away): its connection is dropped, and its pipe hears nothing more."""
        self.pipe = None
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


# -- connections -----------------------------------------------------------------------------------------
#: Hold at most this much of an undelivered response body before pausing the upstream socket.
HOLD_LIMIT: Final = 256 * 1024
_NO_BODY_STATUS: Final = frozenset({204, 304})


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


class State(IntEnum):
    """Where an upstream connection is in its life (``UpstreamConnection.state``; only the connection
    changes it, each step by one of its methods; a step it does not have raises ``InvalidTransition``)::

        (connected) HELD ──start(body)──► SENDING ──body sent──► SENT ──response over, reusable──► POOLED
                     │  └──start(no body)──────────────────────────►┘                                │
                     └──release (unused)──► POOLED ◄──────────────────────────────────────────────────┘
        POOLED ──taken (by an attempt, or handed to one waiting for a connection)──► HELD
        CLOSED   (from any state: aborted, lost, or released before its exchange ended cleanly)
    """

    HELD = 0  # no exchange, held by whoever made it or took it from the pool
    SENDING = 1  # an exchange: the request body is still going out (the response may have begun)
    SENT = 2  # an exchange: the request went out whole; its response is awaited or being read
    POOLED = 3  # idle in its pool
    CLOSED = 4  # aborted or lost: never used again


# The state is held as a plain int compared with Final literals (compiled, a C int compare; see
# sidecar/native.py); ``State(conn.state)`` names it.
_HELD: Final = 0
_SENDING: Final = 1
_SENT: Final = 2
_POOLED: Final = 3
_CLOSED: Final = 4
assert tuple(State) == (_HELD, _SENDING, _SENT, _POOLED, _CLOSED)


def _invalid(state: int, event: str) -> InvalidTransition:
    return InvalidTransition("upstream connection", State(state).name.lower(), event)


@mypyc_attr(allow_interpreted_subclasses=True)
class Exchange:
    """The owner of one request/response exchange on a connection (an attempt). A base class rather than a
    Protocol: compiled, the connection's calls through it are direct."""

    def on_response(self, response: UpstreamResponse) -> None:
        raise NotImplementedError

    def on_gone(self, error: UpstreamGone) -> None:
        raise NotImplementedError


class UpstreamConnection:  # an asyncio.Protocol by its methods (a plain class compiles native)
    __slots__ = (
        "pool",
        "transport",
        "parser",
        "state",
        "idle_since",
        "exchange",
        "to_report",
        "response",
        "head_request",
        "got_bytes",
        "reason",
        "headers",
        "body",
        "cork",
        "attempt",
        "reading_paused",
    )

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.state: int = _HELD  # changed only through the transitions below
        self.idle_since = 0.0
        # the exchange in progress (SENDING, SENT): who hears of it, and what it has read so far
        self.exchange: Exchange | None = None
        self.to_report: UpstreamResponse | None = None  # a head parsed, not yet told to the exchange
        self.response: UpstreamResponse | None = None
        self.head_request = False  # (after a HEAD's answer, the next exchange gets a new parser)
        self.got_bytes = False
        self.reason = b""
        self.headers: Headers = []
        self.body: RequestBody | None = None
        self.cork: list[bytes] | None = None
        self.attempt = 0
        self.reading_paused = False  # flow control: a held or streamed response's reader is behind

    # -- the state (see State) -------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.state == _CLOSED

    def _reusable(self) -> bool:
        """May the connection carry another exchange? Only when the request went out whole and its
        response came back whole, and the upstream did not say ``Connection: close``."""
        r = self.response
        return self.state == _SENT and r is not None and r.complete and r.error is None and r.keep_alive

    def taken(self) -> None:
        """POOLED -> HELD: its pool hands it to an attempt."""
        if self.state != _POOLED:
            raise _invalid(self.state, "taken")
        self.state = _HELD

    def _back(self) -> None:
        """HELD, or an exchange that ended cleanly -> POOLED: the one road back to the pool (which keeps it
        idle, hands it to a waiter (``taken``), or closes it when the pool is closing)."""
        self.state = _POOLED
        self.pool.returned(self)

    # -- the exchange --------------------------------------------------------------------------------
    def start(
        self, head: bytes, body: RequestBody | None, head_request: bool, attempt: int, exchange: Exchange
    ) -> None:
        """HELD -> SENDING (or SENT, without a body): send a request for ``exchange``, which hears of the
        response head (or :class:`UpstreamGone`)."""
        assert self.transport is not None
        if self.state != _HELD:  # one exchange at a time, never on a closed or pooled connection
            raise _invalid(self.state, "start")
        self.state = _SENT if body is None else _SENDING
        if self.head_request:
            # llhttp waited for Content-Length bytes that never came after the last HEAD: a new parser.
            self.parser = httptools.HttpResponseParser(self)
        self.exchange = exchange
        self.head_request = head_request
        self.attempt = attempt
        self.got_bytes = False
        self.headers = []
        self.reason = b""
        if body is None:
            self.transport.write(head)
        else:
            self.body = body
            self.cork = [head]
            try:
                body.attach(self)
            finally:
                out, self.cork = self.cork, None
            self.transport.write(b"".join(out))

    def release(self) -> None:
        """Whoever holds it is done with it: unused (HELD), or its exchange over cleanly, back to the pool;
        an exchange that did not end cleanly closes it. Released twice, or while pooled: a bug (raises)."""
        state = self.state
        if state == _HELD:
            self._back()
        elif _SENDING <= state <= _SENT:
            if self._reusable():
                self._exchange_done()
            else:
                self.response = None
                self.exchange = None
                self.abort()
        elif state == _POOLED:
            raise _invalid(state, "release")
        # CLOSED: lost meanwhile, nothing to give back

    def abandon(self, exchange: Exchange) -> None:
        """The attempt that owns ``exchange`` gives up: drop the connection if it still serves it."""
        if self.exchange is exchange:
            self.exchange = None  # it hears nothing more
            self.abort()

    def _exchange_over(self) -> None:
        """The response is complete (or, sent whole, the request is): back to the pool if it all ended
        cleanly, needing nobody to hand it back."""
        if self.response is not None and self._reusable():
            self._exchange_done()

    def _exchange_done(self) -> None:
        r = self.response
        if r is not None:
            r.conn = None
        self.response = None
        self.exchange = None
        self.body = None
        if self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        self._back()

    def abort(self) -> None:
        """Drop the connection now (a cancelled attempt, a broken exchange): -> CLOSED."""
        self._detach_body()
        if self.state != _CLOSED:
            self.state = _CLOSED  # from any state
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
        elif self.state != _CLOSED:
            self.transport.writelines(parts)  # type: ignore[union-attr]

    def body_end(self) -> None:
        assert self.body is not None
        if self.body.chunked:
            if self.cork is not None:
                self.cork.append(b"0\r\n\r\n")
            elif self.state != _CLOSED:
                self.transport.write(b"0\r\n\r\n")  # type: ignore[union-attr]
        self.body = None
        if self.state == _SENDING:  # SENDING -> SENT (a connection lost meanwhile stays closed)
            self.state = _SENT
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
        if not self.reading_paused and self.state != _CLOSED:
            self.reading_paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]

    def resume_reading(self) -> None:
        if self.reading_paused and self.state != _CLOSED:
            self.reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]

    # -- asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.exchange is None:  # bytes with no exchange (pooled): the upstream is confused; drop it
            self.abort()
            return
        self.got_bytes = True
        exchange = self.exchange
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._broken(f"malformed upstream response: {e}")
        finally:
            r = self.to_report
            if r is not None:
                # Told only now, with the whole packet parsed: a small response is already complete and
                # goes to the client in one write; and nobody re-enters the parser from its callbacks.
                self.to_report = None
                exchange.on_response(r)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state != _CLOSED:
            self.state = _CLOSED  # from any state
            self.pool.forget(self)
        r = self.response
        exchange = self.exchange
        if exchange is not None and r is None:
            why = "connection reset" if exc is not None else "connection closed"
            self.exchange = None
            self._detach_body()
            exchange.on_gone(UpstreamGone(f"{why} before the response", self.got_bytes))
            return
        if r is not None and not r.complete and r.error is None:
            if r.close_delimited and exc is None:
                r.finished()
            else:
                r.failed("upstream connection lost mid-body")
        self._detach_body()

    def _broken(self, why: str) -> None:
        r = self.response
        exchange = self.exchange
        if exchange is not None and r is None:
            self.exchange = None
            self.abort()
            exchange.on_gone(UpstreamGone(why, True))
            return
        if r is not None and not r.complete:
            r.failed(why)
        self.abort()

    # -- httptools callbacks (no on_message_begin: ``start`` and an informational answer's end reset the
    # head; a callback fewer per response) ------------------------------------------------------------
    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is None:  # after the head come trailers: not forwarded
            add_header(self.headers, name, value)

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            if status == 101:
                raise httptools.HttpParserError("the upstream switched protocols unasked")
            return  # 100 Continue, 103 Early Hints: not forwarded (no response made: see on_message_complete)
        framing = body_framing(self.headers)
        chunked = framing == CHUNKED
        length = framing if framing >= 0 else None  # else chunked, or up to the connection's close
        no_body = self.head_request or status in _NO_BODY_STATUS
        keep_alive = self.parser.should_keep_alive()  # (llhttp forgets it once the message is done)
        r = UpstreamResponse(
            status, self.reason, self.headers, length, chunked, no_body, keep_alive, self, self.attempt
        )
        self.response = r
        self.to_report = r
        if self.head_request:  # complete with its head (llhttp would wait for a body: see start)
            self._exchange_over()

    def on_body(self, body: bytes) -> None:
        r = self.response
        if r is None or r.no_body:
            return
        r.body(body)
        if r.pipe is None and r.held > HOLD_LIMIT:
            self.pause_reading()

    def on_message_complete(self) -> None:
        r = self.response
        if (
            r is None
        ):  # an informational answer (100 Continue, 103 Early Hints): the answer's own head follows
            self.reason = b""
            self.headers = []
            return
        if not r.complete:
            r.finished()
        self._exchange_over()


# -- pools -----------------------------------------------------------------------------------------------
class Pool:
    """Keep-alive connections to one endpoint, at most ``max_connections`` at a time (then requests wait
    for one to come back). ``name``: what the endpoint is called (``orders.prod:8080`` for an address it
    resolved to): the ``Host`` a request gets when its client named none."""

    def __init__(
        self,
        endpoint: str,
        host: str,
        port: int,
        connect_timeout: float,
        max_connections: int,
        name: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.host = host
        self.port = port
        self.host_header = (endpoint if name is None else name).encode("latin-1")
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self.loop = asyncio.get_running_loop()
        self.idle: list[UpstreamConnection] = []
        self.count = 0
        self.waiters: deque[asyncio.Future[UpstreamConnection | None]] = deque()
        self.closing = False

    def take_idle(self) -> UpstreamConnection | None:
        """An idle kept-alive connection, if there is one (no await on the hot path); the taker holds it
        (``release`` or an exchange gives it back)."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                conn.taken()
                return conn
        return None

    async def acquire(self) -> tuple[UpstreamConnection, bool]:
        """A connection (reused when one is idle) and whether it was reused. Raises :class:`ConnectFailed`."""
        conn = self.take_idle()
        if conn is not None:
            return conn, True
        if self.count >= self.max_connections:
            fut = self.loop.create_future()
            self.waiters.append(fut)
            try:
                conn = await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled() and fut.result() is not None:
                    fut.result().release()  # handed over just as we were cancelled: pass it on
                elif fut.done() and not fut.cancelled():
                    self._wake()  # a free slot was ours: pass it on
                raise
            if conn is not None:
                return conn, True
        return await self.connect(), False

    async def connect(self) -> UpstreamConnection:
        if self.closing:  # the endpoint left the upstream's set (or the listener stops): nothing new
            raise ConnectFailed(f"{self.endpoint} is no longer an endpoint of this upstream")
        self.count += 1
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await self.loop.create_connection(  # type: ignore[type-var]  # a protocol by its methods
                    lambda: UpstreamConnection(self), self.host, self.port
                )
        except TimeoutError:
            self._lost_slot()
            raise ConnectFailed(f"connect timeout to {self.endpoint}", timeout=True) from None
        except OSError as e:
            self._lost_slot()
            raise ConnectFailed(f"{self.endpoint}: {e.strerror or e}") from None
        except BaseException:
            self._lost_slot()
            raise
        return conn

    def returned(self, conn: UpstreamConnection) -> None:
        """``conn`` came back (``UpstreamConnection._back``, its only caller): to a request waiting for a
        connection, else idle; closed if the pool is closing."""
        if self.closing:
            conn.abort()
            return
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                conn.taken()
                fut.set_result(conn)
                return
        conn.idle_since = self.loop.time()
        self.idle.append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        """``conn`` closed: free its slot."""
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)
        self._lost_slot()

    def _lost_slot(self) -> None:
        self.count -= 1
        self._wake()

    def _wake(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def sweep(self, now: float, idle_timeout: float) -> None:
        """Close connections idle longer than ``idle_timeout``."""
        for conn in [c for c in self.idle if now - c.idle_since > idle_timeout]:
            conn.abort()

    def close(self) -> None:
        """No more connections: idle ones now, busy ones when released; waiters fail at once."""
        self.closing = True
        for conn in list(self.idle):
            conn.abort()
        self.idle.clear()
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)


class EndpointPools:
    """One upstream's pools (for one listener), one per address: the way ``upstream/discovery.py`` tells the
    adapter that an address left (an ``EndpointWatcher``)."""

    __slots__ = ("by_address",)

    def __init__(self) -> None:
        self.by_address: dict[str, Pool] = {}

    def left(self, address: str) -> None:
        """``address`` left the upstream's set: its pool closes (busy connections when their exchange ends)."""
        pool = self.by_address.pop(address, None)
        if pool is not None:
            pool.close()

    def drained(self, address: str) -> None:
        self.left(address)  # closed already when it left

    def close(self) -> None:
        for pool in self.by_address.values():
            pool.close()
        self.by_address.clear()

    def all(self) -> list[Pool]:
        return list(self.by_address.values())
