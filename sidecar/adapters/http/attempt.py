"""Attempts over HTTP (the runtime's ``CallbackAttempter``): take a pooled connection, send the request with
this attempt's headers, classify the response head when it arrives.

Every attempt carries ``x-sidecar-attempt: N`` (N from 1), the trace context of its own span, and the
deadline header rewritten to what this attempt may take, measured when the request is written: never
more than what remains. A reused keep-alive connection that the upstream had closed (no response byte) is
replaced once, within the attempt, when the request may be sent again.

On the hot path (an idle pooled connection) an attempt is a write and, later, a callback: no task, no
future. Only making a new connection (or waiting for a free one) runs in a task.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Coroutine
from typing import Any, Final

from ...policy import SendAttempt, deadline
from ...runtime import AttemptContext, AttemptResult, CallbackAttempter
from ...telemetry import RequestObserver
from . import upstream
from .classify import NO_TIME, connect_failure, reset
from .plan import Plan
from .replay import RequestBody
from .upstream import ConnectFailed, Pool, UpstreamConnection, UpstreamGone, UpstreamResponse

NO_TIME_LEFT: Final = AttemptResult(NO_TIME)
INF: Final = math.inf
timeout_ms: Final = deadline.timeout_ms
_wall_clock: Final = time.time
#: ``x-sidecar-attempt: N`` lines made once (index N).
_ATTEMPT_LINES: Final = tuple(b"x-sidecar-attempt: %d\r\n" % n for n in range(16))


class Exchange(upstream.Exchange):
    """One attempt on one upstream connection: the connection reports the response head (or its failure)
    here."""

    __slots__ = ("attempter", "cmd", "ctx", "conn", "pool", "reused", "expires")

    def __init__(
        self,
        attempter: Attempter,
        cmd: SendAttempt,
        ctx: AttemptContext,
        conn: UpstreamConnection,
        pool: Pool,
        reused: bool,
        expires: float,
    ) -> None:
        self.attempter = attempter
        self.cmd = cmd
        self.ctx = ctx
        self.conn = conn
        self.pool = pool
        self.reused = reused
        self.expires = expires

    def on_response(self, response: UpstreamResponse) -> None:
        self.attempter.responded(self, response)

    def on_gone(self, error: UpstreamGone) -> None:
        self.attempter.gone(self, error)


class Attempter(CallbackAttempter):
    __slots__ = (
        "loop",
        "plan",
        "body",
        "head_request",
        "obs",
        "base",
        "name_endpoint",
        "ctx",
        "overflowed",
        "resend_ok",
        "exchange",
        "more_exchanges",
        "tasks",
    )

    obs: RequestObserver  # the request's telemetry, set once it is admitted (``Forwarding.begun``)

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        plan: Plan,
        body: RequestBody | None,
        head_request: bool,
        base: bytes,
        name_endpoint: bool,
        resend_ok: bool,
    ) -> None:
        """``body``: the request's (``None``: it has none); ``head_request``: a HEAD (its answer has no body);
        ``base``: the request head without the per-attempt lines and the final blank line;
        ``name_endpoint``: ``base`` has no Host header, each attempt names its endpoint."""
        self.loop = loop
        self.plan = plan
        self.body = body
        self.head_request = head_request
        self.base = base
        self.name_endpoint = name_endpoint
        self.ctx: AttemptContext | None = None
        self.overflowed = False
        self.resend_ok = resend_ok
        # Attempts waiting for a response head: the first in a slot, any others (hedges) in a dict made
        # when needed (most requests have one attempt at a time: no dict per request).
        self.exchange: Exchange | None = None
        self.more_exchanges: dict[int, Exchange] | None = None
        self.tasks: dict[int, asyncio.Task[None]] | None = None  # attempts waiting for a connection

    def body_overflowed(self) -> None:
        """The body outgrew the replay buffer (its owner, the request, says so): this attempt is the last."""
        self.overflowed = True
        self.obs.buffer_exceeded()
        if self.ctx is not None:
            self.ctx.buffer_exceeded()

    # -- the runtime's CallbackAttempter -----------------------------------------------------------------
    def start(self, cmd: SendAttempt, ctx: AttemptContext) -> None:
        if self.ctx is None and self.overflowed:
            ctx.buffer_exceeded()
        self.ctx = ctx
        now = ctx.now
        expires = now + cmd.timeout
        pool = self.plan.pool(cmd.endpoint)
        conn = pool.take_idle()
        if conn is None:
            self._in_task(cmd.attempt, self._connect(cmd, ctx, pool, expires, fresh=False))
            return
        self._send(conn, cmd, ctx, pool, True, expires, now)

    def cancel(self, attempt: int) -> None:
        ex = self._waiting(attempt)
        if ex is not None:
            self._forget(ex)
            ex.conn.abandon(ex)
        task = self.tasks.pop(attempt, None) if self.tasks else None
        if task is not None:
            task.cancel()

    def discard(self, payload: UpstreamResponse) -> None:
        payload.release()

    # -- sending ---------------------------------------------------------------------------------------
    def _in_task(self, n: int, coro: Coroutine[Any, Any, None]) -> None:
        """Run attempt ``n``'s connecting in a task (the hot path, an idle pooled connection, needs none)."""
        if self.tasks is None:
            self.tasks = {}
        self.tasks[n] = self.loop.create_task(coro)

    def _task_over(self, n: int) -> bool:
        """Attempt ``n``'s task is done with; was it still running (not cancelled)?"""
        return self.tasks is not None and self.tasks.pop(n, None) is not None

    async def _connect(
        self, cmd: SendAttempt, ctx: AttemptContext, pool: Pool, expires: float, fresh: bool
    ) -> None:
        """Get a connection (a new one when ``fresh``: the pooled one had gone stale), then send."""
        n = cmd.attempt
        try:
            if fresh:
                conn, reused = await pool.connect(), False
            else:
                conn, reused = await pool.acquire()
        except ConnectFailed as e:
            self._task_over(n)
            ctx.done(AttemptResult(connect_failure(e.detail)))
            return
        if not self._task_over(n):  # cancelled just as the connection came
            conn.release()
            return
        self._send(conn, cmd, ctx, pool, reused and not fresh, expires)

    def _send(
        self,
        conn: UpstreamConnection,
        cmd: SendAttempt,
        ctx: AttemptContext,
        pool: Pool,
        reused: bool,
        expires: float,
        now: float | None = None,
    ) -> None:
        """Write this attempt's request on ``conn`` (``now``: the loop time, when the caller just read it)."""
        n = cmd.attempt
        lines = [self.base]
        if self.name_endpoint:  # the endpoint's name, not the address it resolved to
            lines.append(b"Host: %s\r\n" % pool.host_header)
        lines.append(_ATTEMPT_LINES[n] if n < len(_ATTEMPT_LINES) else b"x-sidecar-attempt: %d\r\n" % n)
        if expires != INF:
            ms = timeout_ms(expires - (self.loop.time() if now is None else now))
            if ms <= 0:
                conn.release()
                ctx.done(NO_TIME_LEFT)
                return
            lines.append(self.plan.deadline_prefix)
            lines.append(b"%d\r\n" % ms)
        headers = ctx.headers
        if headers:
            for name, value in headers.items():
                lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
        lines.append(b"\r\n")
        ex = Exchange(self, cmd, ctx, conn, pool, reused, expires)
        if self.exchange is None:
            self.exchange = ex
        else:
            if self.more_exchanges is None:
                self.more_exchanges = {}
            self.more_exchanges[cmd.attempt] = ex
        try:
            conn.start(b"".join(lines), self.body, self.head_request, cmd.attempt, ex)
        except BaseException:
            self._forget(ex)
            conn.abort()
            raise

    # -- results (from the connection) -----------------------------------------------------------------
    def responded(self, ex: Exchange, resp: UpstreamResponse) -> None:
        n = ex.cmd.attempt
        if self._waiting(n) is not ex:
            resp.release()  # cancelled meanwhile
            return
        self._forget(ex)
        status = resp.status
        self.obs.set_attempt_attribute(n, "http.response.status_code", status)
        outcome = self.plan.classifier.response(status, resp.headers, _wall_clock())
        ex.ctx.answer(outcome, resp)

    def gone(self, ex: Exchange, error: UpstreamGone) -> None:
        n = ex.cmd.attempt
        if self._waiting(n) is not ex:
            return
        self._forget(ex)
        if ex.reused and not error.got_bytes and self.resend_ok and self._replayable():
            # The pooled connection had gone stale (closed by the upstream while idle): once more, on a new one.
            self._in_task(n, self._connect(ex.cmd, ex.ctx, ex.pool, ex.expires, fresh=True))
            return
        ex.ctx.done(AttemptResult(reset(error.detail)))

    def _waiting(self, n: int) -> Exchange | None:
        """Attempt ``n``'s exchange, if it still waits for its response head."""
        ex = self.exchange
        if ex is not None and ex.cmd.attempt == n:
            return ex
        return self.more_exchanges.get(n) if self.more_exchanges else None

    def _forget(self, ex: Exchange) -> None:
        if self.exchange is ex:
            self.exchange = None
        elif self.more_exchanges:
            self.more_exchanges.pop(ex.cmd.attempt, None)

    def _replayable(self) -> bool:
        body = self.body
        return body is None or (body.replayable and not body.dropped)
