"""One client connection: an asyncio Protocol parsing requests with httptools (llhttp).

Requests are answered one after another, in order (pipelined requests wait their turn, their bodies held
back by flow control). A request's handling starts once the packet that carried its head has been parsed
whole (so a small body is already there to go upstream in the same write) and runs in callbacks: there is
no task per connection or per request. The request being answered (``request.Forwarding``) owns what it
writes; the connection passes the client's flow control on to it.

Two states, each changed only here: ``State``, where the connection is in answering, and ``Reading``, where
the client is in sending (h11 keeps the two sides apart the same way). Every refusal's status and text is
chosen by ``answer.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from enum import IntEnum
from typing import Final

import httptools
from mypy_extensions import mypyc_attr

from ...buffer_budget import BufferBudget
from ..transitions import InvalidTransition
from . import answer as answers
from . import methods
from .answer import Answer, encode
from .headers import NOT_CHUNKED, STRIDE, UNSTATED, VALUE, add_header, body_framing
from .replay import RequestBody
from .request import ClientConnection, Forwarder, Forwarding, IncomingRequest, refused

log: Final = logging.getLogger("sidecar.http")

#: Parsed requests waiting behind the one being answered before reading pauses.
PIPELINE_DEPTH: Final = 16
CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"


class _Refused(Exception):
    """Raised in a parser callback: give ``answer`` before anything goes upstream."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.status)
        self.answer = answer


class State(IntEnum):
    """Where a client connection is in its life (``ServerConnection.state``; only the connection changes it).

    ::

        IDLE ──start──► BUSY ──answered──► IDLE         keep-alive: on to the next request
          │               │
          │ close_after   │ close_after                  Connection: close, a refusal, a drain, the client's EOF
          ▼               ▼
        CLOSING ◄─answered─ LAST                          answer what is queued (start: CLOSING -> LAST), then
          │                                               close the transport
          ▼
        CLOSED   (from any state, when the transport is lost)
    """

    IDLE = 0  # open, no request being answered: reading the next
    BUSY = 1  # answering the request at the head of the queue
    LAST = 2  # answering, and closing once what is queued is answered
    CLOSING = 3  # nothing being answered; what is queued is answered, then the transport closes
    CLOSED = 4  # the transport is gone: nothing is read or written


# The state is held as a plain int compared with Final literals (compiled, a C int compare; see
# sidecar/native.py); ``State(conn.state)`` names it.
_IDLE: Final = 0
_BUSY: Final = 1
_LAST: Final = 2
_CLOSING: Final = 3
_CLOSED: Final = 4
assert tuple(State) == (_IDLE, _BUSY, _LAST, _CLOSING, _CLOSED)


class Reading(IntEnum):
    """Where the client is in sending (``ServerConnection.reading``; only the connection changes it)::

    HEAD ──headers complete──► BODY ──message complete──► HEAD
      └──────────────── the client's EOF (from either) ──────────► DONE
    """

    HEAD = 0  # between requests, or in a request's head
    BODY = 1  # the head is parsed: the body (or its trailers) is being read
    DONE = 2  # the client half-closed: what it completed is answered, then the connection closes


_HEAD: Final = 0
_BODY: Final = 1
_DONE: Final = 2
assert tuple(Reading) == (_HEAD, _BODY, _DONE)


@mypyc_attr(allow_interpreted_subclasses=True)
class ConnectionOwner:
    """What a client connection needs of its listener (``server.HttpListener``)."""

    forwarder: Forwarder  # swapped by a config reload: each request takes the one current when it begins
    replay_limit: int
    buffers: BufferBudget  # the process-wide budget kept request bodies count against
    max_header_size: int
    stopping: bool

    def connection_opened(self, conn: ServerConnection) -> None:
        raise NotImplementedError

    def connection_closed(self, conn: ServerConnection) -> None:
        raise NotImplementedError

    def connection_idle(self, conn: ServerConnection) -> None:
        raise NotImplementedError

    def refused(self, status: int) -> None:
        raise NotImplementedError


class ServerConnection(ClientConnection):  # an asyncio.Protocol by its methods (compiles native)
    __slots__ = (
        "listener",
        "loop",
        "transport",
        "parser",
        "current",
        "queue",
        "state",
        "reading",
        "active",
        "in_next",
        "client_ip",
        "client_host",
        "read_paused_by",
        "write_paused",
        "last_activity",
        "max_header_size",
        "at_boundary",
        "held",
        "ext_method",
    )

    def __init__(self, listener: ConnectionOwner, loop: asyncio.AbstractEventLoop) -> None:
        self.listener = listener
        self.max_header_size = listener.max_header_size
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.current: IncomingRequest | None = None  # being parsed
        self.queue: deque[IncomingRequest] = deque()  # parsed, waiting to be (or being) answered
        self.state: int = _IDLE  # changed only through the transitions below
        self.reading: int = _HEAD  # likewise
        self.active: Forwarding | None = None  # the request being answered (queue[0])
        self.in_next = False
        self.client_ip = b""  # for X-Forwarded-For, encoded once per connection
        self.client_host = ""  # the same, as the door's exemptions read it
        self.read_paused_by: set[str] = set()
        self.write_paused = False
        self.last_activity = self.loop.time()
        self.at_boundary = True  # the parser was fed from a request's first byte (methods.py)
        self.held = b""  # the start of an extension method, until its end arrives
        self.ext_method = b""  # the client's method, when the parser was given a stand-in

    # -- the state (see State) -------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """Is a request being answered?"""
        return _BUSY <= self.state <= _LAST

    @property
    def closed(self) -> bool:
        return self.state == _CLOSED

    # Inline on the hot path (a call costs more than the compare): ``self.state <= _BUSY``, open (neither
    # closing nor closed); ``self.state == _IDLE or self.state == _CLOSING``, free to start the next request.

    def _start(self) -> None:
        """The request at the head of the queue is being answered."""
        state = self.state
        if state == _IDLE:
            self.state = _BUSY
        elif state == _CLOSING:
            self.state = _LAST
        else:
            raise InvalidTransition("client connection", State(state).name.lower(), "start answering")

    def _answered(self) -> None:
        """The request being answered is done with (answered or given up)."""
        state = self.state
        if state == _BUSY:
            self.state = _IDLE
        elif state == _LAST:
            self.state = _CLOSING
        elif state != _CLOSED:  # a connection lost meanwhile has nothing left to answer
            raise InvalidTransition("client connection", State(state).name.lower(), "answered")

    def _close_after_queue(self) -> None:
        """Answer what is queued, read nothing new, then close."""
        state = self.state
        if state == _BUSY:
            self.state = _LAST
        elif state == _IDLE:
            self.state = _CLOSING

    def _lost(self) -> None:
        """The transport is gone (from any state)."""
        self.state = _CLOSED

    def _head_parsed(self) -> None:
        if self.reading != _HEAD:
            raise InvalidTransition("client connection", Reading(self.reading).name.lower(), "head parsed")
        self.reading = _BODY

    def _message_over(self) -> None:
        """A request's last byte was parsed (or a new one begins): the next is a head."""
        if self.reading == _BODY:
            self.reading = _HEAD

    def _client_done(self) -> None:
        """The client's EOF: it sends nothing more."""
        self.reading = _DONE

    # -- asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.client_host = peer[0] if peer else ""
        self.client_ip = self.client_host.encode("latin-1")
        self.listener.connection_opened(self)
        if self.listener.stopping:
            self.close()

    def data_received(self, data: bytes) -> None:
        self.last_activity = self.loop.time()
        if self.current is None and self.state > _BUSY:
            return  # after a refusal or during shutdown: nothing more is read
        if self.held:  # the start of an extension method (methods.py)
            data, self.held = self.held + data, b""
        while True:
            self.at_boundary = self.current is None
            try:
                self.parser.feed_data(data)
                if self.queue and (self.state == _IDLE or self.state == _CLOSING):
                    self._next()
                return
            except httptools.HttpParserInvalidMethodError as e:
                again = self._extension_method(data)
                if again is not None:
                    data = again
                    if data:
                        continue
                else:
                    self._refuse(answers.malformed(e))
            except httptools.HttpParserUpgrade as e:
                self._upgrade(data[e.args[0] :] if e.args else b"")
            except httptools.HttpParserCallbackError as e:
                refusal = e.__context__
                if isinstance(refusal, _Refused):
                    self._refuse(refusal.answer)
                else:
                    log.exception("HTTP request parsing failed in a callback")
                    self._refuse(answers.unreadable())
            except httptools.HttpParserError as e:
                self._refuse(answers.malformed(e))
            break
        if self.queue and (self.state == _IDLE or self.state == _CLOSING):
            self._next()

    def _extension_method(self, data: bytes) -> bytes | None:
        """The parser refused a method it does not know (RFC 9110 allows any token): parse the request again
        from where it begins with a method it knows in its place (``on_headers_complete`` puts the client's
        back). Returns what to feed the new parser (empty: wait for the rest of the method), or ``None``: no
        token, a malformed request. Found only when ``data`` began at a request boundary (a packet that
        carries the end of one body and then an extension method is refused)."""
        if not self.at_boundary:
            return None
        found = methods.rewrite(data)
        if found is None:
            return None
        self.parser = httptools.HttpRequestParser(self)
        self.current = None
        if not found.method:
            self.held = found.rest
            return b""
        self.ext_method = found.method
        return found.rest

    def eof_received(self) -> bool:
        """The client sent all it will (``shutdown(SHUT_WR)``, ``nc -N``): the requests it completed are
        answered, in order, then the connection closes (as HAProxy does without ``abortonclose``). A
        request cut short (head or body incomplete) can never be answered: the connection is dropped. A
        client gone altogether is seen when an answer cannot be written to it."""
        self._client_done()
        queue = self.queue
        if self.current is not None or (queue and not queue[-1].body_complete):
            self.drop()
            return False
        if not queue:
            self._close_after_queue()
            return False
        return True  # keep the sending side open for the answers

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()
        self.listener.connection_closed(self)
        active, self.active = self.active, None
        if active is not None:
            active.client_gone()
        for req in self.queue:  # the active one's too: it is queue[0]
            if req.body is not None:
                req.body.discard()
                req.body.release()
        self.queue.clear()
        self.listener.connection_idle(self)

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.active is not None:
            self.active.client_paused()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.active is not None:
            self.active.client_resumed()

    # -- httptools callbacks ---------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.current = IncomingRequest(self.last_activity)  # the loop time data_received just read
        self._message_over()

    def on_url(self, url: bytes) -> None:
        req = self.current
        assert req is not None
        req.url += url
        req.head_size += len(url)
        if req.head_size > self.max_header_size:
            raise self._head_too_large()

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self.current
        assert req is not None
        if self.reading == _BODY:
            return  # trailers: not forwarded
        add_header(req.headers, name, value)
        req.head_size += len(name) + len(value) + 4
        if req.head_size > self.max_header_size:
            raise self._head_too_large()

    def _head_too_large(self) -> _Refused:
        return _Refused(answers.head_too_large(self.max_header_size))

    def on_headers_complete(self) -> None:
        req = self.current
        assert req is not None
        p = self.parser
        method = p.get_method()
        if self.ext_method:
            method, self.ext_method = self.ext_method, b""
        req.method = method
        req.head_request = method == b"HEAD"
        req.keep_alive = keep_alive = p.should_keep_alive()
        headers = req.headers
        framing = body_framing(headers)
        if framing == NOT_CHUNKED:  # RFC 9112 6.3: the body's end cannot be known
            te = b", ".join(
                headers[i + VALUE]
                for i in range(0, len(headers), STRIDE)
                if headers[i] == b"transfer-encoding"
            )
            raise _Refused(answers.not_chunked(te.decode("latin-1")))
        length: int | None = framing if framing >= 0 else 0 if framing == UNSTATED else None  # None: chunked
        req.zero_length = framing == 0  # RFC 9112 6.3: kept, some servers (nginx) want a length
        expect = False
        connection = False
        for i in range(0, len(headers), STRIDE):
            n = headers[i]
            if n == b"expect":
                expect = headers[i + VALUE].strip().lower() == b"100-continue"
            elif n == b"connection":
                connection = True
        # Kept alive with no Connection header is HTTP/1.1 (1.0 needs ``Connection: keep-alive``); only
        # otherwise is the version asked for (httptools formats a new string for it each time).
        req.version = "1.1" if keep_alive and not connection else p.get_http_version()
        if length != 0:
            req.body = RequestBody(length, self.listener.replay_limit, self, self.listener.buffers)
            req.expect_continue = expect and req.version == "1.1"
        self._head_parsed()
        self._enqueue(req)
        if len(self.queue) > PIPELINE_DEPTH:
            self.pause_for("pipeline")

    def on_body(self, body: bytes) -> None:
        req = self.current
        if req is not None and req.body is not None:
            req.body.feed(body)

    def on_message_complete(self) -> None:
        req = self.current
        self.current = None
        self._message_over()
        if req is not None and req.body is not None:
            req.body.end()

    # -- errors in the client's bytes ------------------------------------------------------------------
    def _refuse(self, answer: Answer) -> None:
        """Give ``answer`` after what is queued, then close; read nothing more. Nothing of the refused
        request completes upstream: if its head was fine and its body broke (a malformed chunk header, a
        Content-Length trailer) the parser stopped before the body's end."""
        req = self.current
        self.current = None
        self._close_after_queue()
        self.pause_for("refused")
        if req is not None and req in self.queue:
            active = self.active
            if active is not None and active.req is req:  # forwarding began: its attempts end, it answers
                if not active.refuse_body(answer):
                    self.drop()  # its answer is already on its way: nothing sane can follow
                return
            if req is not self.queue[0] or not self.busy:  # queued, not begun: refused in its place
                self.queue.remove(req)
                if req.body is not None:
                    req.body.discard()
            else:
                self.drop()
                return
        self.listener.refused(answer.status)
        self._enqueue(refused(self.loop.time(), answer))
        if not self.busy:
            self._next()

    def _upgrade(self, rest: bytes) -> None:
        req = self.queue[-1] if self.queue else None
        if req is None or req.method == b"CONNECT":
            if req is not None:
                req.refusal = answers.connect_method()
                req.keep_alive = False
                self.listener.refused(req.refusal.status)
            self._close_after_queue()
            self.pause_for("refused")
            return
        # An Upgrade request (e.g. WebSocket) is forwarded as a plain request (Upgrade is hop-by-hop).
        self.parser = httptools.HttpRequestParser(self)
        if rest:
            self.data_received(rest)

    def drop(self) -> None:
        """Drop the connection at once (its client sees a reset)."""
        self._close_after_queue()
        if self.transport is not None:
            self.transport.abort()

    # -- flow control (replay.ReadControl) -------------------------------------------------------------
    def pause_for(self, why: str) -> None:
        if not self.read_paused_by and self.transport is not None and self.state != _CLOSED:
            self.transport.pause_reading()
        self.read_paused_by.add(why)

    def resume_for(self, why: str) -> None:
        if why in self.read_paused_by:
            self.read_paused_by.discard(why)
            if not self.read_paused_by and self.transport is not None and self.state != _CLOSED:
                self.transport.resume_reading()

    def pause_body(self) -> None:
        self.pause_for("body")

    def resume_body(self) -> None:
        self.resume_for("body")

    def pause_budget(self) -> None:
        self.pause_for("budget")

    def resume_budget(self) -> None:
        self.resume_for("budget")

    def send_continue(self) -> None:
        if self.state != _CLOSED:
            self.transport.write(CONTINUE)  # type: ignore[union-attr]

    # -- answering -------------------------------------------------------------------------------------
    def _enqueue(self, req: IncomingRequest) -> None:
        self.queue.append(req)  # started by data_received once the packet is parsed (see _next)

    def _next(self) -> None:
        """Answer queued requests in order, while each is answered at once; the rest follow
        ``request_done``."""
        if self.in_next:
            return
        self.in_next = True
        try:
            queue = self.queue
            while queue and (self.state == _IDLE or self.state == _CLOSING):
                req = queue[0]
                self._start()
                if req.refusal is not None:
                    self.write(encode(req.refusal, keep_alive=False))
                    self.close()
                    break
                try:
                    self.listener.forwarder.begin(req, self)
                except Exception:
                    log.exception("answering a request failed")
                    self.abort_request(req)
                    break
            if not queue and (self.reading == _DONE or self.state > _BUSY) and self.state != _CLOSED:
                self.close()
        finally:
            self.in_next = False
        if self.state != _BUSY and self.state != _LAST:
            self.listener.connection_idle(self)

    def request_done(self, req: IncomingRequest) -> None:
        """``req`` is answered (or given up): on to the next one, or close."""
        if req.body is not None:
            req.body.release()
        if self.state == _CLOSED:
            return
        self.active = None
        queue = self.queue
        if queue and queue[0] is req:
            queue.popleft()
        self._answered()
        if self.read_paused_by and len(queue) <= PIPELINE_DEPTH:
            self.resume_for("pipeline")
        if not self.keep_alive_after(req):
            self.close()
            self.listener.connection_idle(self)
            return
        self.last_activity = self.loop.time()
        self._next()

    def abort_request(self, req: IncomingRequest) -> None:
        """Something went wrong answering ``req``: drop the connection (its client sees it closed)."""
        self.active = None
        self._answered()
        self.drop()

    def answering(self, fwd: Forwarding) -> None:
        self.active = fwd

    def close_after_answer(self) -> None:
        self._close_after_queue()

    def sweep(self, now: float, header_timeout: float, idle_timeout: float, body_timeout: float) -> None:
        """The listener's periodic look: a head not complete within header_timeout, a stalled request body,
        an idle connection past its time, an upstream response that stopped coming."""
        current = self.current
        if current is not None and self.reading != _BODY and now - current.began > header_timeout:
            # counted from the head's first byte: bytes trickling in do not extend it (the idle timer)
            self._refuse(answers.head_timeout(header_timeout))
            return
        idle = now - self.last_activity
        active = self.active
        # a body stalled by the client (not by the sidecar's own flow control: reading paused; but a body
        # held back because the process's buffer budget is full counts), and no answer on its way to it
        # (an upstream may answer before the body is complete)
        paused = self.read_paused_by
        if (
            idle > body_timeout
            and active is not None
            and (not paused or (len(paused) == 1 and "budget" in paused))
            and not active.streaming
        ):
            body = active.req.body
            if body is not None and not body.complete:
                active.body_stalled(body_timeout)
                return
        if idle <= idle_timeout:
            return
        if not self.busy and self.current is None:
            self.close()  # idle keep-alive connection
        elif self.current is not None and self.current not in self.queue and not self.busy:
            self._refuse(answers.head_idle(idle_timeout))
        elif active is not None and active.streaming:
            active.upstream_silent("no data from the upstream within idle_timeout")

    def keep_alive_after(self, req: IncomingRequest) -> bool:
        """May this connection carry another request after ``req``'s answer?"""
        body = req.body
        return req.keep_alive and self.state <= _BUSY and (body is None or body.complete)

    def write(self, data: bytes) -> None:
        if self.state != _CLOSED:
            self.transport.write(data)  # type: ignore[union-attr]

    def close(self) -> None:
        self._close_after_queue()
        if self.transport is not None and self.state != _CLOSED:
            self.transport.close()

    def write_body(self, chunk: bytes, chunked: bool) -> None:
        if self.state == _CLOSED:
            return
        self.last_activity = self.loop.time()
        if chunked:
            self.transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))  # type: ignore[union-attr]
        else:
            self.transport.write(chunk)  # type: ignore[union-attr]

    def writable(self) -> bool:
        return self.state != _CLOSED
