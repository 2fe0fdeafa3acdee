"""One attempt over HTTP (the runtime's ``Attempter``): take a pooled connection, send the request with
this attempt's headers, classify the response head.

Every attempt carries ``x-sidecar-attempt: N`` (N from 1), the trace context of its own span, and the
deadline header rewritten to what this attempt may take, measured when the request is written: never
more than what remains. A reused keep-alive connection that the upstream had closed (no response byte) is
replaced once, within the attempt, when the request may be sent again.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING

from ...policy import Outcome, OutcomeClass, SendAttempt, deadline
from ...runtime import AttemptContext, AttemptResult
from ...telemetry import RequestObserver
from .classify import CONNECT_FAILURE, CONNECT_TIMEOUT
from .client import ConnectFailed, UpstreamConnection, UpstreamGone
from .plan import Plan
from .request import IncomingRequest
from .response import UpstreamResponse

if TYPE_CHECKING:
    from .pool import Pool

C = OutcomeClass
NO_TIME_LEFT = Outcome(C.TIMEOUT, detail="no time left to send")
INF = math.inf
timeout_ms = deadline.timeout_ms


class Attempter:
    __slots__ = ("loop", "plan", "req", "obs", "base", "name_endpoint", "ctx", "overflowed", "resend_ok")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        plan: Plan,
        req: IncomingRequest,
        obs: RequestObserver,
        base: bytes,
        name_endpoint: bool,
        resend_ok: bool,
    ) -> None:
        """``base``: the request head without the per-attempt lines and the final blank line;
        ``name_endpoint``: ``base`` has no Host header, each attempt names its endpoint."""
        self.loop = loop
        self.plan = plan
        self.req = req
        self.obs = obs
        self.base = base
        self.name_endpoint = name_endpoint
        self.ctx: AttemptContext | None = None
        self.overflowed = False
        self.resend_ok = resend_ok
        if req.body is not None:
            req.body.on_overflow = self.body_overflowed

    def body_overflowed(self) -> None:
        """The body outgrew the replay buffer: this attempt is the last."""
        self.overflowed = True
        self.obs.buffer_exceeded()
        if self.ctx is not None:
            self.ctx.buffer_exceeded()

    async def send(self, cmd: SendAttempt, ctx: AttemptContext) -> AttemptResult:
        if self.ctx is None and self.overflowed:
            ctx.buffer_exceeded()
        self.ctx = ctx
        expires = self.loop.time() + cmd.timeout
        pool = self.plan.pool(cmd.endpoint)
        conn = pool.take_idle()
        reused = conn is not None
        if conn is None:
            try:
                conn, reused = await pool.acquire()
            except ConnectFailed as e:
                return AttemptResult(_connect_failed(e))
        waiter = self._start(conn, cmd, ctx, expires)
        if waiter is None:
            pool.release(conn)
            return AttemptResult(NO_TIME_LEFT)
        try:
            resp = await waiter
        except UpstreamGone as e:
            conn.abandon(waiter)
            if not (reused and not e.got_bytes and self.resend_ok and self._replayable()):
                return AttemptResult(Outcome(C.RESET, detail=e.detail))
            return await self._resend(pool, cmd, ctx, expires)
        except BaseException:  # cancelled: per-try timeout, deadline, hedge lost, client gone
            conn.abandon(waiter)
            raise
        return self._classify(cmd, resp)

    def discard(self, payload: UpstreamResponse) -> None:
        payload.release()

    def _classify(self, cmd: SendAttempt, resp: UpstreamResponse) -> AttemptResult:
        status = resp.status
        self.obs.set_attempt_attribute(cmd.attempt, "http.response.status_code", status)
        return AttemptResult(self.plan.classifier.response(status, resp.headers, time.time()), resp)

    async def _resend(
        self, pool: Pool, cmd: SendAttempt, ctx: AttemptContext, expires: float
    ) -> AttemptResult:
        """The pooled connection had gone stale (closed by the upstream while idle): once more, on a new one."""
        try:
            conn = await pool.connect()
        except ConnectFailed as e:
            return AttemptResult(_connect_failed(e))
        try:
            waiter = self._start(conn, cmd, ctx, expires)
            if waiter is None:
                pool.release(conn)
                return AttemptResult(NO_TIME_LEFT)
            resp = await self._response(conn, waiter)
        except UpstreamGone as e:
            return AttemptResult(Outcome(C.RESET, detail=e.detail))
        return self._classify(cmd, resp)

    def _replayable(self) -> bool:
        body = self.req.body
        return body is None or (body.replayable and not body.dropped)

    def _start(
        self, conn: UpstreamConnection, cmd: SendAttempt, ctx: AttemptContext, expires: float
    ) -> asyncio.Future[UpstreamResponse] | None:
        """Write this attempt's request; ``None`` when no time is left to send it."""
        lines = [self.base]
        if self.name_endpoint:
            lines.append(b"Host: %s\r\n" % cmd.endpoint.encode("latin-1"))
        lines.append(b"x-sidecar-attempt: %d\r\n" % cmd.attempt)
        if expires != INF:
            ms = timeout_ms(expires - self.loop.time())
            if ms <= 0:
                return None
            lines.append(self.plan.deadline_name + b": %d\r\n" % ms)
        for name, value in ctx.headers.items():
            lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
        lines.append(b"\r\n")
        req = self.req
        try:
            return conn.start(b"".join(lines), req.body, req.head_request, cmd.attempt)
        except BaseException:
            conn.abort()
            raise

    @staticmethod
    async def _response(
        conn: UpstreamConnection, waiter: asyncio.Future[UpstreamResponse]
    ) -> UpstreamResponse:
        try:
            return await waiter
        except BaseException:  # broken, cancelled (per-try timeout, deadline, hedge lost, client gone)
            conn.abandon(waiter)
            raise


def _connect_failed(e: ConnectFailed) -> Outcome:
    base = CONNECT_TIMEOUT if e.timeout else CONNECT_FAILURE
    return Outcome(base.cls, detail=e.detail)
