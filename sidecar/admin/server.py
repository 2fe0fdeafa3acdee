"""``/healthz`` (the process runs), ``/readyz`` (every listener is bound and accepting), ``/metrics`` (Prometheus text),
``/config`` (the effective configuration, secrets redacted).

The pages are plain functions in a route table (``routes.py``); this module only carries them over HTTP/1.1,
parsed by httptools (the parser the HTTP listener uses: no web framework loaded for a few small pages). It
answers GET and HEAD (405 for other methods, 404 for other paths), keeps connections alive, answers
pipelined requests in order, and serves a route that waits (a long poll) on its own connection's task, so
other connections are not held up. A client gets bounded room (``Limits``): so many bytes of request head
and of body (read and discarded), so long to send a whole request and to stay idle or leave an answer
unread, so many requests read ahead of their answers, so many connections at once (more wait in the kernel's
backlog). A malformed request gets 400 and its connection closes; nothing a client sends reaches further
than its own connection.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, unquote

import httptools

from ..adapters.acceptor import Acceptor
from ..config.units import split_host_port
from ..telemetry.exposition import CONTENT_TYPE, Registry, render
from .routes import JSON, NOT_FOUND, AdminRequest, AdminResponse, Route, text

log = logging.getLogger("sidecar.admin")


@dataclass(frozen=True, slots=True)
class Limits:
    """What one admin client may hold (the defaults suit probes, Prometheus and the console)."""

    max_head: int = 16 * 1024  # request line and headers, bytes (more: 431)
    max_body: int = 64 * 1024  # an admin request needs none; a small one is read and discarded (more: 413)
    request_timeout: float = 10.0  # seconds from a request's first byte to its last (then closed)
    idle_timeout: float = 60.0  # seconds with no request on a kept-alive connection, or an answer unread
    #: Requests read ahead of their answers: then the connection is not read (and more arriving in the same
    #: read are answered 429, and the connection closed).
    max_pipelined: int = 16
    max_connections: int = 256  # at once; more wait in the kernel's backlog


METHOD_NOT_ALLOWED = AdminResponse(405, b"method not allowed\n", headers=(("Allow", "GET, HEAD"),))
INTERNAL_ERROR = AdminResponse(500, b"internal error\n")


class AdminServer:
    def __init__(
        self,
        listen: str,
        *,
        registry: Registry,
        ready: Callable[[], bool],
        effective_config: dict[str, Any],
        live: Callable[[], dict[str, Any]] | None = None,
        limits: Limits = Limits(),
    ) -> None:
        """``live``: what ``/config`` shows beside the effective config, read when asked (each upstream's
        resolved addresses); ``limits``: what one client may hold."""
        self.host, self.port = split_host_port(listen)
        self.limits = limits
        self._registry = registry
        self._ready = ready
        self._config: dict[str, Any] = {}
        self._live = live
        self.show(effective_config)
        self._acceptor: Acceptor | None = None
        self._connections: set[_Connection] = set()
        self.address: tuple[str, int] = (self.host, self.port)
        #: GET routes by exact path; more may be added before ``start`` (``add``).
        self.routes: dict[str, Route] = {
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/metrics": self._metrics,
            "/config": self._config_page,
        }

    @property
    def connections(self) -> int:
        """Client connections open now."""
        return len(self._connections)

    def add(self, path: str, route: Route) -> None:
        self.routes[path] = route

    def show(self, effective_config: dict[str, Any]) -> None:
        """``/config`` answers with this from now on (the live config, after a reload)."""
        self._config = effective_config

    async def start(self) -> None:
        self._acceptor = await Acceptor.start(
            "admin",
            lambda: _Connection(self),
            self.host,
            self.port,
            max_connections=self.limits.max_connections,
            count=lambda: len(self._connections),
        )
        self.address = self._acceptor.sockets[0].getsockname()[:2]

    async def stop(self) -> None:
        """Stop accepting and close every connection (a request being answered is cancelled)."""
        acceptor, self._acceptor = self._acceptor, None
        if acceptor is not None:
            acceptor.close()
            await acceptor.wait_closed()
        for conn in list(self._connections):
            conn.abort()
        await asyncio.gather(
            *(c.task for c in self._connections if c.task is not None), return_exceptions=True
        )

    async def respond(self, request: AdminRequest) -> AdminResponse:
        """The route table's answer to ``request`` (what goes on the wire is the connection's business)."""
        route = self.routes.get(request.path)
        if route is None:
            return NOT_FOUND
        if request.method not in ("GET", "HEAD"):
            return METHOD_NOT_ALLOWED
        try:
            result = route(request)
            response = await result if inspect.isawaitable(result) else result
        except Exception:  # a page's bug answers 500 to that request only
            log.exception("admin: %s %s failed", request.method, request.path)
            return INTERNAL_ERROR
        if not _safe(response):
            log.error("admin: %s answered a header with a line break in it", request.path)
            return INTERNAL_ERROR
        return response

    # -- connections (the acceptor asks how many there are) ------------------------------------------
    def opened(self, conn: _Connection) -> None:
        self._connections.add(conn)

    def closed(self, conn: _Connection) -> None:
        self._connections.discard(conn)
        if self._acceptor is not None:
            self._acceptor.room()

    # -- the built-in pages --------------------------------------------------------------------------
    def _healthz(self, request: AdminRequest) -> AdminResponse:
        return text("ok\n")

    def _readyz(self, request: AdminRequest) -> AdminResponse:
        return text("ready\n") if self._ready() else text("not ready\n", 503)

    def _metrics(self, request: AdminRequest) -> AdminResponse:
        return AdminResponse(200, render(self._registry.collect()), CONTENT_TYPE)

    def _config_page(self, request: AdminRequest) -> AdminResponse:
        data = self._config if self._live is None else {**self._config, **self._live()}
        return AdminResponse(200, json.dumps(data, indent=2).encode(), JSON)


class _Refused(Exception):
    """Raised from a parser callback: answer ``status`` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Pending:
    """A request read, waiting for its answer; ``fixed``: the answer is already known (a refusal)."""

    __slots__ = ("request", "keep_alive", "version", "fixed")

    def __init__(
        self, request: AdminRequest, keep_alive: bool, version: str, fixed: AdminResponse | None = None
    ) -> None:
        self.request = request
        self.keep_alive = keep_alive
        self.version = version
        self.fixed = fixed


class _Connection(asyncio.Protocol):
    """One client: its parser, the requests it sent waiting for their answers, and the task answering them
    in order (started when a request is complete, ended when none waits)."""

    def __init__(self, server: AdminServer) -> None:
        self.server = server
        self.limits = server.limits
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.peer = ""
        self.pending: deque[_Pending] = deque()
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.closing = False  # no more requests are read: those queued are answered, then it closes
        self.reading = True
        self.mid_request = False  # a request's first byte came, its last not yet
        self.in_head = True  # between requests, or reading a request's head
        self.head_bytes = 0  # bytes received while a head is incomplete (at least the head's)
        self.head_size = 0  # the request line's and headers' bytes, as parsed
        self.body_bytes = 0
        self.url = b""
        self.host: str | None = None  # the request's Host header, when it sent one

    # -- asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self.server.opened(self)
        self._wait(self.limits.idle_timeout)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if self.in_head:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:
            refusal = e.__context__
            if isinstance(refusal, _Refused):
                self._refuse(refusal.status, str(refusal))
            else:
                log.exception("admin: parsing a request failed in a callback")
                self._refuse(400, "bad request")
            return
        except httptools.HttpParserUpgrade:
            self._stop_reading()  # no protocol switch here: what was asked is answered, then it closes
            return
        except httptools.HttpParserError as e:
            self._refuse(400, f"malformed request: {e}")
            return
        if self.in_head and self.head_bytes > self.limits.max_head:
            self._refuse(431, f"request head larger than {self.limits.max_head} bytes")

    def eof_received(self) -> bool:
        """The client sent all it will: the requests it completed are answered, then the connection closes."""
        self._stop_reading()  # a request cut short (mid_request) is never answered
        if self.task is None:
            self._close()
            return False
        return True  # keep the sending side open for the answers

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._cancel_timer()
        self.pending.clear()
        self.writable.set()
        if self.task is not None:
            self.task.cancel()
        self.server.closed(self)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- httptools callbacks ---------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.mid_request = True
        self.url = b""
        self.host = None
        self.head_size = 0
        self.body_bytes = 0
        self._wait(self.limits.request_timeout)

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._head_grew(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_grew(len(name) + len(value) + 4)
        if name.lower() == b"host":
            if self.host is not None:  # RFC 9112 3.2: a request with more than one is refused
                raise _Refused(400, "more than one Host header")
            self.host = value.decode("latin-1").strip()

    def _head_grew(self, by: int) -> None:
        """Counted from what the parser hands over (a whole head may come in one read, never seen
        incomplete: the count of bytes received while it is, in ``data_received``, would miss it)."""
        self.head_size += by
        if self.head_size > self.limits.max_head:
            raise _Refused(431, f"request head larger than {self.limits.max_head} bytes")

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.head_bytes = 0

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.limits.max_body:
            raise _Refused(413, f"request body larger than {self.limits.max_body} bytes")

    def on_message_complete(self) -> None:
        self.mid_request = False
        self.in_head = True
        self.head_bytes = 0
        self._cancel_timer()
        parser = self.parser
        if len(self.pending) >= self.limits.max_pipelined:  # all came in one read: the rest is refused
            raise _Refused(429, f"more than {self.limits.max_pipelined} requests sent ahead of their answers")
        keep_alive = parser.should_keep_alive()
        request = self._request(parser.get_method().decode("ascii", "replace"))
        self._queue(_Pending(request, keep_alive, parser.get_http_version()))
        if not keep_alive:
            self._stop_reading()
        elif len(self.pending) >= self.limits.max_pipelined:
            self._pause_reading()  # until half of them are answered

    def _request(self, method: str) -> AdminRequest:
        try:
            url = httptools.parse_url(self.url)
        except httptools.HttpParserInvalidURLError:
            raise _Refused(400, "malformed request target") from None
        path = unquote(url.path.decode("utf-8", "replace")) if url.path else self.url.decode("latin-1")
        query: dict[str, str] = {}
        if url.query:
            for key, value in parse_qsl(url.query.decode("utf-8", "replace"), keep_blank_values=True):
                query.setdefault(key, value)
        return AdminRequest(method, path, query, self.peer, self.host)

    # -- answering -------------------------------------------------------------------------------------
    def _queue(self, p: _Pending) -> None:
        self.pending.append(p)
        if self.task is None:
            self.task = self.loop.create_task(self._answer_all(), name=f"admin connection from {self.peer}")

    async def _answer_all(self) -> None:
        try:
            while self.pending:
                p = self.pending[0]
                response = p.fixed if p.fixed is not None else await self.server.respond(p.request)
                self.pending.popleft()
                last = not p.keep_alive or (self.closing and not self.pending)
                if not await self._write(response, p, last):
                    return
                if last:
                    self._close()
                    return
                if (
                    not self.reading
                    and not self.closing
                    and len(self.pending) <= self.limits.max_pipelined // 2
                ):
                    self._resume_reading()
        finally:
            self.task = None
        if self.transport is not None and not self.transport.is_closing() and not self.mid_request:
            self._wait(self.limits.idle_timeout)

    async def _write(self, response: AdminResponse, p: _Pending, last: bool) -> bool:
        """Send the answer once the client read the previous ones (False: it did not, within the idle timeout)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return False
        if not self.writable.is_set():
            try:
                await asyncio.wait_for(self.writable.wait(), self.limits.idle_timeout)
            except TimeoutError:
                log.debug("admin: %s reads no answers; closing", self.peer)
                transport.abort()
                return False
        transport.write(_head(response, p.version, last))
        if p.request.method != "HEAD" and response.body:
            transport.write(response.body)
        return True

    def _refuse(self, status: int, message: str) -> None:
        """Answer the requests read before, then ``status`` for this one (it could not be read), then close."""
        log.debug("admin: refused a request from %s: %s", self.peer, message)
        self._stop_reading()
        self.mid_request = False
        self._cancel_timer()
        refusal = AdminResponse(status, message.encode() + b"\n")
        self._queue(_Pending(AdminRequest("GET", "", {}, self.peer), False, "1.1", refusal))

    # -- reading, timing out, closing -------------------------------------------------------------------
    def _wait(self, seconds: float) -> None:
        self._cancel_timer()
        self.timer = self.loop.call_later(seconds, self._timed_out)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        """A request too slow to arrive, or a connection idle between requests: closed."""
        self.timer = None
        if (self.mid_request or self.task is None) and self.transport is not None:
            log.debug("admin: closing the connection from %s (timed out)", self.peer)
            self.transport.abort()

    def _stop_reading(self) -> None:
        self.closing = True
        self._pause_reading()

    def _pause_reading(self) -> None:
        if self.reading and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self.reading = False

    def _resume_reading(self) -> None:
        if not self.reading and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        self.reading = True

    def _close(self) -> None:
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()


def _head(response: AdminResponse, version: str, last: bool) -> bytes:
    status = response.status
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    lines = [
        f"HTTP/1.1 {status} {phrase}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
    ]
    lines += [f"{name}: {value}" for name, value in response.headers]
    if last:
        lines.append("Connection: close")
    elif version == "1.0":
        lines.append("Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")


def _safe(response: AdminResponse) -> bool:
    """No line break in what becomes a header (a page's bug must not split the answer)."""
    fields = [response.content_type, *(part for header in response.headers for part in header)]
    return not any("\r" in f or "\n" in f for f in fields)
