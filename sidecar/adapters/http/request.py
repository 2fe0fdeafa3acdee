"""One request: what the listener read of it (:class:`IncomingRequest`), and forwarding it: route it, set it
up (``Services.begin_request``: its deadline, telemetry and engine call), let the engine drive the attempts
(``attempt.py``), answer.

The request head sent upstream is built once per request (hop-by-hop headers dropped, ``X-Forwarded-For``
and ``-Proto`` added, the body's framing restated) and completed per attempt (``attempt.py``). The answer
follows the engine's finish (see ``answer.py``): the chosen upstream response is streamed to the client
as it arrives, or the sidecar answers itself.

Admission (issue 12): a listener with a request limit asks its door once the head is read, before any
upstream work (``Forwarder._enter``): a refused request is answered at once (429, ``answer.refused``), a
queued one waits on the loop's timer heap with its driver not yet started (``Forwarding.queued``), and a
client that leaves while queued gives its token back.

All of it runs in protocol callbacks: :meth:`Forwarder.begin` starts a request's :class:`~sidecar.runtime.Driver`
and returns; the driver calls :meth:`Forwarding.finished` when the engine is done, from whichever callback
brought the last event; the connection hears ``request_done`` once the answer is complete.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Final

import httptools
from mypy_extensions import mypyc_attr

from ...admission import Kind
from ...admission.refusal import Refusal
from ...config.schema import HttpListenerConfig
from ...config.units import split_host_port
from ...gates.door import Door, Wait
from ...gates.ticket_gate import gate as ticket_gate
from ...policy import Finish, Reason
from ...policy.deadline import parse_timeout_ms
from ...runtime import CallOwner, Driver
from ...services import Services
from ...telemetry import RequestObserver
from ...timers import TimerEntry, Timers, timers_for
from .answer import Answer, encode, for_finish, text
from .answer import refused as refusal_answer
from .attempt import Attempter
from .headers import BadRequest, Headers, find_header, request_head, response_head
from .plan import Plan
from .replay import RequestBody
from .routing import Router, Target, split_host, valid_host
from .upstream import Pool, UpstreamResponse

log: Final = logging.getLogger("sidecar.http")
_LOOPBACK: Final = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""})
_CANCELLED: Final = Reason.CANCELLED  # enum members as Final aliases (the convention: sidecar/native.py)
_DEADLINE: Final = Reason.DEADLINE
_METHODS: Final = {
    m: m.decode() for m in (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE")
}


IDEMPOTENT: Final = frozenset({b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE", b"TRACE"})
#: Methods whose attempts take a read ticket of an upstream's ``concurrency`` (issue 12); any other, a write.
READS: Final = frozenset({b"GET", b"HEAD", b"OPTIONS"})
_READ: Final = Kind.READ
_WRITE: Final = Kind.WRITE


class IncomingRequest:
    __slots__ = (
        "began",
        "method",
        "url",
        "version",
        "headers",
        "keep_alive",
        "body",
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

@mypyc_attr(allow_interpreted_subclasses=True)
class ClientConnection:
    """What a request asks of the client connection it came on (``connection.ServerConnection``): a narrow
    interface, so that the request never touches the connection's state and the two modules do not import
    each other."""

    loop: asyncio.AbstractEventLoop
    client_ip: bytes
    last_activity: float  # the loop time the callback that got here read

    def answering(self, fwd: Forwarding) -> None:
        """``fwd`` is the request being answered now (the connection tells it if the client goes away)."""
        raise NotImplementedError

    def keep_alive_after(self, req: IncomingRequest) -> bool:
        """May the connection carry another request after ``req``'s answer?"""
        raise NotImplementedError

    def close_after_answer(self) -> None:
        """Close once the answer being written is out (``Connection: close`` was or will be said)."""
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def stream(self, resp: UpstreamResponse, chunked: bool, owner: Forwarding) -> None:
        """Write ``resp``'s body as it comes; ``owner.stream_over(resp, ok)`` follows."""
        raise NotImplementedError

    def request_done(self, req: IncomingRequest) -> None:
        """``req`` is answered (or given up): on to the next one, or close."""
        raise NotImplementedError

    def abort_request(self, req: IncomingRequest) -> None:
        """Something went wrong answering ``req``: drop the connection."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Forwarder:
    def __init__(self, config: HttpListenerConfig, services: Services) -> None:
        self.name = config.name
        self.services = services
        self.telemetry = services.telemetry
        self.tracing = services.telemetry.tracer is not None
        self.rejected = services.telemetry.metrics.listener(config.name)
        self.loop: asyncio.AbstractEventLoop | None = None  # set by bind()
        self.timers: Timers | None = None
        self.host, self.port = split_host_port(config.listen)
        self.router = Router(config, services.config.upstreams)
        self.pools: dict[str, dict[str, Pool]] = {}
        self.plans: dict[int, Plan] = {}  # by id(target): the router's targets are a fixed set
        self._self_hosts: dict[bytes, bool] = {}
        self.is_self = self._is_self  # bound once, not per request
        self._last_target: Target | None = None
        self._last_plan: Plan | None = None
        door = services.door(config.name)
        self.door: Door | None = door if door is not None and door.requests is not None else None

    def bind(self, loop: asyncio.AbstractEventLoop, address: tuple[str, int]) -> None:
        """The listener is serving at ``address`` (its real port, when the config said 0) on ``loop``."""
        self.loop = loop
        self.timers = timers_for(loop)
        self.host, self.port = address
        self._self_hosts.clear()

    def plan(self, target: Target) -> Plan:
        plan = self.plans.get(id(target))
        if plan is None:
            pools = self.pools.setdefault(target.upstream, {})
            plan = Plan(
                self.services.policy(target.policy),
                self.services.upstream(target.upstream),
                target.retry_non_idempotent,
                pools,
                self.telemetry.metrics.meters(self.name, target.upstream),
            )
            self.plans[id(target)] = plan
        return plan

    def all_pools(self) -> list[Pool]:
        return [p for pools in self.pools.values() for p in pools.values()]

    # -- one request -----------------------------------------------------------------------------------
    def begin(self, req: IncomingRequest, conn: ClientConnection) -> None:
        """Start forwarding ``req``; ``conn.request_done(req)`` follows once it is answered (perhaps at once)."""
        url = req.url
        authority: bytes | None = None
        if (url and url[0] == 47) or url == b"*":  # origin-form ("/..."; url[0] is an int, no slice made)
            target_url = url
            if self.router.routes:
                host = find_header(req.headers, b"host")
                path = url.partition(b"?")[0].decode("latin-1")
                target = self.router.route(host.decode("latin-1") if host else None, path)
            else:
                target = self.router.fallback
        else:
            try:
                u: Any = httptools.parse_url(url)  # its fields may be None, whatever its stubs say
            except httptools.HttpParserInvalidURLError:
                return self._refuse(req, conn, 400, "malformed request target")
            if not u.schema or u.schema.lower() != b"http" or not u.host:  # RFC 9110 4.2.3: any case
                return self._refuse(req, conn, 403, "only http:// targets can be proxied")
            port = u.port or 80
            hostname = u.host.decode("latin-1")
            path = (u.path or b"/").decode("latin-1")
            found = self.router.proxy(hostname, port, path)
            if found is None:
                return self._refuse(
                    req,
                    conn,
                    403,
                    f"no upstream named or reached at {hostname}:{port}: the sidecar is not an open proxy",
                )
            target = found
            target_url = (u.path or b"/") + (b"?" + u.query if u.query else b"")
            authority = u.host if u.port is None else b"%s:%d" % (u.host, u.port)
        last = self._last_plan
        if target is self._last_target and last is not None:  # most requests go where the one before went
            plan = last
        else:
            plan = self.plans.get(id(target)) or self.plan(target)
            self._last_target, self._last_plan = target, plan
        body = req.body
        try:
            rh = request_head(
                req.method,
                target_url,
                req.headers,
                client_ip=conn.client_ip,
                deadline_header=plan.deadline_lname,
                body_length=(0 if req.zero_length else None) if body is None else body.length,
                chunked=body is not None and body.chunked,
                authority=authority,
                is_self=self.is_self,
                replace_trace=self.tracing,
            )
        except BadRequest as e:  # before anything went upstream; what follows on the connection is suspect
            conn.close_after_answer()
            return self._refuse(req, conn, 400, str(e))
        timeout = parse_timeout_ms(rh.deadline) if rh.deadline is not None else None  # the client's
        method = "GET" if req.method == b"GET" else _METHODS.get(req.method) or req.method.decode("latin-1")
        attrs: dict[str, str | int] | None = None
        if self.tracing:  # span attributes cost only when there are spans
            attrs = {
                "http.request.method": method,
                "url.path": target_url.partition(b"?")[0].decode("latin-1"),
                "url.scheme": "http",
            }
            host = rh.client_host if authority is None else authority
            if host:
                h, p = split_host(host.decode("latin-1"))
                attrs["server.address"] = h
                if p is not None:
                    attrs["server.port"] = p
        elif self.telemetry.tap is not None:  # the console's tap shows the path (never the query string)
            attrs = {"url.path": target_url.partition(b"?")[0].decode("latin-1")}
        may_retry = req.idempotent or plan.retry_non_idempotent
        if body is not None:
            body.restrict(plan.replay_limit)
        # Envoy's rule: the per-try timeout and the sidecar's own deadline start once the whole request is
        # upstream; an upload still arriving is not the upstream's time (the client's deadline still counts).
        complete = body is None or body.complete
        door = self.door
        wait: Wait | None = None
        if door is not None:  # admission: after the whole head, before any upstream work
            entry = self._enter(door, req, conn, target_url, timeout)
            if isinstance(entry, Refusal):
                return self._refused(entry, req, conn, plan, method, attrs, rh.trace)
            wait = entry
        call, obs = self.services.begin_request(
            plan.policy,
            plan.upstream,
            listener=self.name,
            protocol="http",
            name=method,
            attributes=attrs,
            parent=rh.trace,
            meters=plan.meters,
            arrival=req.began,
            received=timeout,
            request_complete=complete,
            replayable=body is None or body.replayable,
            retry_on=None if may_retry else plan.connect_only,
        )
        attempter = Attempter(conn.loop, plan, body, req.head_request, obs, rh.head, rh.host is None, may_retry)
        fwd = Forwarding(self, req, conn, obs, attempter)
        if not complete:
            assert body is not None
            body.on_complete = fwd.body_complete
        conn.answering(fwd)
        timers = self.timers
        if timers is None:
            timers = self.timers = timers_for(conn.loop)
        tickets = plan.upstream.concurrency
        gate = None
        if tickets is not None:  # the upstream limits attempts in flight: each waits for its ticket
            exempt = door is not None and door.path_exempt(target_url.partition(b"?")[0].decode("latin-1"))
            gate = ticket_gate(tickets, _READ if req.method in READS else _WRITE, conn.loop, exempt)
        fwd.driver = Driver(call, attempter, obs, fwd, conn.loop, timers, gate)
        if wait is not None and door is not None:
            fwd.queued(door, wait, timers, complete)  # the driver starts when its token is due
            return
        # conn.last_activity: the loop time read by the callback that got here (data_received, or
        # request_done for a pipelined request), as loop.time() would say again
        fwd.driver.start(conn.last_activity)

    def _enter(
        self, door: Door, req: IncomingRequest, conn: ClientConnection, url: bytes, timeout: float | None
    ) -> Refusal | Wait | None:
        """The request gate: go ahead (``None``), refused, or wait. Exempt: the client's address in
        ``exempt_cidrs``, the path in the listener's ``exempt_paths``."""
        if door.exemptions and (
            door.client_exempt(conn.client_ip.decode("latin-1"))
            or door.path_exempt(url.partition(b"?")[0].decode("latin-1"))
        ):
            door.exempt()
            return None
        deadline = req.began + timeout if timeout is not None else math.inf
        return door.request(conn.last_activity, deadline)

    def _refused(
        self,
        refusal: Refusal,
        req: IncomingRequest,
        conn: ClientConnection,
        plan: Plan,
        method: str,
        attrs: dict[str, str | int] | None,
        parent: Any,
    ) -> None:
        obs = self.services.refused(
            refusal,
            listener=self.name,
            upstream=plan.upstream.name,
            protocol="http",
            name=method,
            attributes=attrs,
            parent=parent,
            meters=plan.meters,
        )
        answer = refusal_answer(refusal)
        write_answer(req, conn, answer)
        obs.set_attribute("http.response.status_code", answer.status)
        obs.end(refusal.reason.value)
        conn.request_done(req)

    def _is_self(self, host: bytes) -> bool:
        """Does ``Host`` name the sidecar itself (``127.0.0.1:15001``)? Then the upstream is told its own
        name instead; any other Host (a virtual host the app means) is passed on."""
        known = self._self_hosts.get(host)
        if known is None:
            value = host.decode("latin-1")
            if not valid_host(value):
                raise BadRequest(f"malformed Host header: {value!r}")
            h, port = split_host(value)
            known = (
                h in _LOOPBACK or h == self.host.lower() and port in (None, self.port)
            )
            if len(self._self_hosts) < 1024:
                self._self_hosts[host] = known
        return known

    def _refuse(self, req: IncomingRequest, conn: ClientConnection, status: int, message: str) -> None:
        self.rejected.reject(str(status))
        write_answer(req, conn, text(status, message))
        conn.request_done(req)


def write_answer(req: IncomingRequest, conn: ClientConnection, answer: Answer) -> None:
    """Write the sidecar's own ``answer`` to ``req`` (what is left of its body is discarded)."""
    keep = conn.keep_alive_after(req)
    if not keep:
        conn.close_after_answer()
    if req.body is not None and not req.body.complete:
        req.body.discard()
    conn.write(encode(answer, keep, head_only=req.head_request))


class Forwarding(CallOwner):
    """One request between ``begin`` and its complete answer."""

    __slots__ = (
        "forwarder",
        "req",
        "conn",
        "obs",
        "attempter",
        "driver",
        "response",
        "body_refusal",
        "door",
        "wait",
        "wake",
        "timers",
        "began_complete",
    )

    def __init__(
        self,
        forwarder: Forwarder,
        req: IncomingRequest,
        conn: ClientConnection,
        obs: RequestObserver,
        attempter: Attempter,
    ) -> None:
        self.forwarder = forwarder
        self.req = req
        self.conn = conn
        self.obs = obs
        self.attempter = attempter
        self.driver: Driver | None = None
        self.response: UpstreamResponse | None = None  # being streamed to the client
        self.body_refusal: tuple[int, str] | None = None  # the body stalled or broke: answered this, then closed
        # admission: queued for a token until ``wait.at`` (the driver not started yet)
        self.door: Door | None = None
        self.wait: Wait | None = None
        self.wake: TimerEntry | None = None
        self.timers: Timers | None = None
        self.began_complete = True

    def _over(self) -> None:
        """The answer is complete: on to the connection's next request. The references that tie this
        request's objects into cycles are dropped, so they are freed at once rather than by the collector."""
        self.driver = None
        self.attempter.ctx = None
        self.conn.request_done(self.req)

    # -- admission: queued for a token ------------------------------------------------------------------
    def queued(self, door: Door, wait: Wait, timers: Timers, complete: bool) -> None:
        """Wait for the borrowed token (``wait.at``) before the driver starts. ``complete``: the call was
        set up with the whole request received."""
        self.door = door
        self.wait = wait
        self.timers = timers
        self.began_complete = complete
        self.wake = timers.call_at(wait.at, self.admitted)

    def admitted(self) -> None:
        """The token is due: the request goes ahead."""
        wait, door, driver = self.wait, self.door, self.driver
        self.wait = self.wake = None
        if wait is None or door is None or driver is None:
            return
        now = self.conn.loop.time()
        door.admitted(wait, now)
        driver.start(now)
        if not self.began_complete and self.req.body_complete and driver.finish is None:
            driver.request_complete(now)

    def _leave_queue(self) -> bool:
        """Stop waiting (the client went away, or its body stalled): the token goes back. False: it was not
        waiting."""
        wait, wake = self.wait, self.wake
        if wait is None:
            return False
        self.wait = self.wake = None
        if wake is not None and self.timers is not None:
            self.timers.cancel(wake)
        if self.door is not None:
            self.door.interrupted(wait)
        return True

    def body_complete(self) -> None:
        """The client's whole body has arrived and gone to the attempts in flight: their clocks start."""
        if self.wait is not None:
            return  # queued: the driver is told when it starts
        driver = self.driver
        if driver is not None and driver.finish is None:
            driver.request_complete()

    def body_stalled(self, timeout: float) -> None:
        """Nothing of the request body came for ``request_body_timeout``: abandon the attempts, answer 408,
        close (the rest of the body will not be read)."""
        if not self.refuse_body(408, f"request body stalled for request_body_timeout ({timeout:g}s)"):
            self.conn.close()  # answered already: the connection cannot carry another request

    def refuse_body(self, status: int, why: str) -> bool:
        """The request body stalled or broke its framing: abandon the attempts (an upstream never sees the
        request complete), or leave the door's queue, answer ``status``, close. False: too late, the answer
        is on its way."""
        if self._leave_queue():  # still queued for admission: no driver yet, answered here
            self.body_refusal = (status, why)
            self._answer_body_refusal()
            return True
        driver = self.driver
        if driver is None or driver.finish is not None:
            return False
        self.body_refusal = (status, why)
        driver.client_gone()  # -> finished(cancelled), answered there
        return True

    def client_gone(self) -> None:
        """The client disconnected: stop the attempts, or the response being streamed."""
        if self._leave_queue():
            self.obs.end("client went away")
            self._over()
            return
        if self.driver is not None and self.driver.finish is None:
            self.driver.client_gone()  # -> finished(cancelled)
            return
        resp, self.response = self.response, None
        if resp is not None:
            resp.pipe = None  # what the upstream connection says as it is dropped is not news
            resp.abort()
            log.info("client went away before its response was complete")
            self.obs.end("client went away")

    def finished(self, finish: Finish, payload: Any) -> None:
        """The engine is done: answer the client (the chosen upstream response, or the sidecar's own)."""
        try:
            self._answer(finish, payload)
        except Exception:
            log.exception("answering a request failed")
            self.obs.end("internal error")
            self.conn.abort_request(self.req)

    def _answer(self, finish: Finish, payload: Any) -> None:
        req, conn, obs = self.req, self.conn, self.obs
        if finish.reason is _CANCELLED:
            if payload is not None:
                self.attempter.discard(payload)
            if self.body_refusal is not None:
                self._answer_body_refusal()
                return
            obs.end("client went away")
            self._over()
            return
        resp: UpstreamResponse | None = None
        if isinstance(payload, UpstreamResponse):  # (a native class: the cheap test first)
            resp = payload
        elif isinstance(payload, Refusal):  # no ticket for the last attempt: the sidecar answers (503)
            self._refused(finish, payload)
            return
        expired = finish.outcome is not None and finish.outcome.deadline_expired
        if resp is not None and (finish.reason is _DEADLINE or expired) and not finish.own_deadline:
            # The client's deadline: nobody waits for it any more, or the upstream said it ran out of time:
            # never a body to pass on. (Without a client deadline, the upstream's answer is delivered as is.)
            self.attempter.discard(resp)
            resp = None
        if resp is None:
            answer = for_finish(finish, self.attempter.plan.expired_status)
            if answer is not None:
                write_answer(req, conn, answer)
                obs.set_attribute("http.response.status_code", answer.status)
            obs.end(None if answer is None or answer.status < 500 else answer.body.decode().strip())
            self._over()
            return
        obs.set_attribute("http.response.status_code", resp.status)
        self._deliver(resp)

    def _answer_body_refusal(self) -> None:
        """Answer the body's refusal (``refuse_body``) and close the connection after it."""
        refusal = self.body_refusal
        assert refusal is not None
        status, why = refusal
        self.forwarder.rejected.reject(str(status))
        self.conn.close_after_answer()
        write_answer(self.req, self.conn, text(status, why))
        self.obs.set_attribute("http.response.status_code", status)
        self.obs.end(why)
        self._over()

    def _refused(self, finish: Finish, refusal: Refusal) -> None:
        """The request ends on an attempt that got no ticket (``ticket_gate.py``): 503 and when to come back;
        unless the client's deadline ended it, which is answered as such (nobody waits for a 503 any more)."""
        req, conn, obs = self.req, self.conn, self.obs
        answer: Answer | None
        if finish.reason is _DEADLINE and not finish.own_deadline:
            answer = for_finish(finish, self.attempter.plan.expired_status)
        else:
            answer = refusal_answer(refusal)
            obs.refused(refusal)
        if answer is not None:
            write_answer(req, conn, answer)
            obs.set_attribute("http.response.status_code", answer.status)
        obs.end(refusal.message)
        self._over()

    def _deliver(self, resp: UpstreamResponse) -> None:
        """Write the chosen response: its head and what arrived of its body at once, then the rest as it
        comes (``stream_over`` follows)."""
        req, conn = self.req, self.conn
        with_body = not (resp.no_body or req.head_request)
        lines, chunked, keep = response_head(
            resp.status,
            resp.reason,
            resp.headers,
            length=resp.length,
            with_body=with_body,
            client_version=req.version,
            keep_alive=conn.keep_alive_after(req),
        )
        if not keep:
            conn.close_after_answer()
        if not with_body:
            conn.write(b"".join(lines))
            resp.release()
            self.obs.end(None)
            self._over()
            return
        for chunk in resp.take_held():
            if chunked:
                lines += (b"%x\r\n" % len(chunk), chunk, b"\r\n")
            else:
                lines.append(chunk)
        if resp.complete or resp.error is not None:
            if chunked and resp.complete:
                lines.append(b"0\r\n\r\n")
            conn.write(b"".join(lines))
            self.stream_over(resp, resp.error is None)
            return
        conn.write(b"".join(lines))
        self.response = resp
        conn.stream(resp, chunked, self)

    def stream_over(self, resp: UpstreamResponse, ok: bool) -> None:
        """The response went out whole (``ok``) or broke off."""
        self.response = None
        resp.release()
        if not ok:
            self.conn.close()
        self.obs.end(None if ok else "upstream response broke off")
        self._over()
