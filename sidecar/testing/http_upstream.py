"""A scriptable HTTP upstream on 127.0.0.1 (aiohttp) for tests, the demo and benchmarks.

Each request takes the next scripted :class:`Fault` if one is queued, else the standing behaviour: an
optional random failure rate, a latency with a slow tail (``slow_fraction`` of requests ``slow_factor``
times slower), and a 200. A fault can answer any status, add ``Retry-After`` or a millisecond pushback
header, delay, hang until the client gives up, reset the connection, or answer "deadline expired" the
userver way. Every request is recorded (:class:`Seen`) with the attempt and deadline headers it carried,
and whether its client went away before the answer.

Paths: ``/bytes/N`` streams N bytes (``?chunked=1`` without a length); anything else answers ``body``.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

ATTEMPT = "x-sidecar-attempt"
TIMEOUT_MS = "X-YaTaxi-Client-TimeoutMs"


@dataclass(frozen=True)
class Fault:
    """One scripted answer. ``delay``: seconds before answering; ``hang``: never answer (until the client
    goes away); ``reset``: reset the connection instead of answering; ``deadline_expired``: answer 498 with
    ``X-YaTaxi-Deadline-Expired: 1`` (userver's "I could not make it in time")."""

    status: int = 503
    retry_after: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0
    hang: bool = False
    reset: bool = False
    deadline_expired: bool = False
    body: bytes = b"upstream says no\n"


@dataclass
class Seen:
    """What the upstream received."""

    method: str
    path: str
    attempt: int | None
    timeout_ms: int | None
    headers: dict[str, str]
    at: float
    body_len: int = 0
    answered: int | None = None  # the status sent, None when none was (reset, client gone)
    cancelled: bool = False  # the client went away before the answer
    reset: bool = False  # the upstream reset the connection (scripted)
    peer: int = 0  # the client's port: requests over one kept-alive connection share it


@dataclass
class FaultyUpstream:
    """Start with ``async with FaultyUpstream(...) as up:``; ``up.endpoint`` is its ``host:port``."""

    latency: float = 0.0
    slow_fraction: float = 0.0
    slow_factor: float = 50.0
    fail_rate: float = 0.0
    fail: Fault | tuple[Fault, ...] = field(default_factory=Fault)  # one is drawn per failure
    body: bytes = b"ok\n"
    seed: int = 1
    keep_records: bool = True
    script: deque[Fault] = field(default_factory=deque)
    received: list[Seen] = field(default_factory=list)
    hits: int = 0
    cancelled: int = 0
    in_flight: int = 0  # requests being answered now
    peak_in_flight: int = 0  # the most at once
    hold: asyncio.Event | None = None  # when set to an unset event, every request waits for it (tests)
    host: str = "127.0.0.1"  # any of 127/8 (a name's addresses in tests: 127.0.0.2, .3, .4)
    _runner: web.AppRunner | None = None
    _port: int = 0
    _waiters: list[tuple[Any, int, asyncio.Future[None]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rand = random.Random(self.seed)

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self, port: int = 0) -> FaultyUpstream:
        app = web.Application(client_max_size=1 << 40)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, port, reuse_address=True)
        await site.start()
        self._port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FaultyUpstream:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def open_connections(self) -> int:
        """Client connections open now (kept-alive ones included)."""
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self._port}"

    # -- scripting -------------------------------------------------------------------------------------
    def then(self, *faults: Fault) -> FaultyUpstream:
        """Queue faults for the next requests, in order."""
        self.script.extend(faults)
        return self

    def fail_next(self, n: int, status: int = 503, **kw: Any) -> FaultyUpstream:
        """The next ``n`` requests answer ``status`` (``retry_after=``, ``delay=``, ... as in :class:`Fault`)."""
        return self.then(*[Fault(status=status, **kw)] * n)

    # -- waiting (tests wait on events, not sleeps) ---------------------------------------------------
    async def wait_hits(self, n: int) -> None:
        await self._wait(lambda: self.hits, n)

    async def wait_cancelled(self, n: int) -> None:
        await self._wait(lambda: self.cancelled, n)

    async def wait_in_flight(self, n: int) -> None:
        """Until ``n`` requests are being answered at once."""
        await self._wait(lambda: self.in_flight, n)

    async def _wait(self, value: Any, n: int) -> None:
        if value() >= n:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((value, n, fut))
        await fut

    def _notify(self) -> None:
        for w in list(self._waiters):
            value, n, fut = w
            if value() >= n:
                self._waiters.remove(w)
                if not fut.done():
                    fut.set_result(None)

    # -- serving ---------------------------------------------------------------------------------------
    def _next(self) -> Fault | None:
        if self.script:
            return self.script.popleft()
        if self.fail_rate and self.rand.random() < self.fail_rate:
            return self.fail if isinstance(self.fail, Fault) else self.rand.choice(self.fail)
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        h = request.headers
        seen = Seen(
            request.method,
            request.path,
            _int(h.get(ATTEMPT)),
            _int(h.get(TIMEOUT_MS)),
            dict(h) if self.keep_records else {},
            loop.time(),
        )
        if self.keep_records:
            peer = request.transport.get_extra_info("peername") if request.transport else None
            seen.peer = peer[1] if peer else 0
            self.received.append(seen)
        self.hits += 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self._notify()
        try:
            if self.hold is not None:
                await self.hold.wait()
            return await self._answer(request, seen)
        except asyncio.CancelledError:
            if seen.reset:
                raise
            seen.cancelled = True
            self.cancelled += 1
            self._notify()
            raise
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request, seen: Seen) -> web.StreamResponse:
        fault = self._next()
        if request.can_read_body:
            n = 0
            async for chunk in request.content.iter_any():
                n += len(chunk)
            seen.body_len = n
        if fault is None:
            delay = self.latency
            if self.slow_fraction and self.rand.random() < self.slow_fraction:
                delay *= self.slow_factor
            if delay:
                await asyncio.sleep(delay)
            if request.path.startswith("/bytes/"):
                return await self._stream(request, seen)
            seen.answered = 200
            return web.Response(body=self.body, content_type="text/plain")
        if fault.delay:
            await asyncio.sleep(fault.delay)
        if fault.hang:
            await asyncio.Event().wait()
        if fault.reset:
            seen.reset = True
            _reset(request)
            return web.Response(status=500)  # never sent: the connection is gone
        headers = dict(fault.headers)
        status = fault.status
        body = fault.body
        if fault.deadline_expired:
            status, body = (fault.status if fault.status != 503 else 498), b"Deadline expired"
            headers["X-YaTaxi-Deadline-Expired"] = "1"
        if fault.retry_after is not None:
            headers["Retry-After"] = fault.retry_after
        seen.answered = status
        return web.Response(status=status, body=body, headers=headers)

    async def _stream(self, request: web.Request, seen: Seen) -> web.StreamResponse:
        total = int(request.path.rsplit("/", 1)[1])
        resp = web.StreamResponse()
        if request.query.get("chunked"):
            resp.enable_chunked_encoding()
        else:
            resp.content_length = total
        await resp.prepare(request)
        block = b"x" * 65536
        left = total
        while left > 0:
            n = min(left, len(block))
            await resp.write(block[:n])
            left -= n
        await resp.write_eof()
        seen.answered = 200
        return resp


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _reset(request: web.Request) -> None:
    """Close the connection with a TCP reset (SO_LINGER 0)."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
