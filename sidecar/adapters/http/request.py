"""One request: what the listener read of it (:class:`IncomingRequest`), and forwarding it: route it, admit
and set it up (``sidecar/admit.py``: the door, its deadline, telemetry, engine call and ticket gate), let the
engine drive the attempts (``attempt.py``), answer.

The request head sent upstream is built once per request (hop-by-hop headers dropped, ``X-Forwarded-For``
and ``-Proto`` added, the body's framing restated) and completed per attempt (``attempt.py``). The answer
follows the engine's finish (see ``answer.py``): the chosen upstream response is streamed to the client
as it arrives, or the sidecar answers itself.

Admission (issue 12): a listener with a request limit asks its door once the head is read, before any
upstream work (``admit.begin``): a refused request is answered at once (429, ``Forwarding.refused``), a
queued one waits on the loop's timer heap with its driver not yet started (``Stage.QUEUED``), and a client
that leaves while queued gives its token back.

All of it runs in protocol callbacks: :meth:`Forwarder.begin` starts a request's :class:`~sidecar.runtime.Driver`
and returns; the driver calls :meth:`Forwarding.finished` when the engine is done, from whichever callback
brought the last event; the connection hears ``request_done`` once the answer is complete. Where a request
is in that life is one explicit :class:`Stage`, changed only by the :class:`Forwarding` itself; the statuses
and texts of the sidecar's own answers are chosen by ``answer.py``, which this module only writes.
"""

from __future__ import annotations

import asyncio
import logging
from enum import IntEnum
from typing import Any, Final

import httptools
from mypy_extensions import mypyc_attr

from ...admission import Kind
from ...admission.refusal import Refusal
from ...admit import Admittee, Way, begin, ticket_refusal
from ...config.schema import HttpListenerConfig
from ...config.units import split_host_port
from ...gates.door import Door, Wait
from ...policy import Call, Finish, Reason
from ...policy.deadline import parse_timeout_ms
from ...runtime import AttemptGate, Driver
from ...services import Services
from ...telemetry import RequestObserver
from ...timers import TimerEntry, Timers, timers_for
from ..transitions import InvalidTransition
from . import answer as answers
from .answer import Answer, encode, for_finish
from .answer import refused as refusal_answer
from .attempt import Attempter
from .headers import BadRequest, Headers, RequestHead, find_header, request_head, response_head
from .plan import Plan
from .replay import RequestBody
from .routing import Router, Target, split_host, valid_host
from .upstream import EndpointPools, Pool, UpstreamResponse

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
        "expect_continue",
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
        self.refusal: Answer | None = None  # answer this instead of forwarding (400, 405, ...: answer.py)
        self.head_request = False  # a HEAD request: its answer has no body (set with ``method``)
        self.zero_length = False  # no body, and the client said so (``Content-Length: 0``): forwarded as such
        self.expect_continue = (
            False  # ``Expect: 100-continue`` (HTTP/1.1): told 100 when an attempt takes the body
        )

    @property
    def idempotent(self) -> bool:
        return self.method in IDEMPOTENT

    @property
    def body_complete(self) -> bool:
        return self.body is None or self.body.complete


def refused(began: float, answer: Answer) -> IncomingRequest:
    """A placeholder in the connection's queue for an answer the sidecar gives itself (then closes)."""
    r = IncomingRequest(began)
    r.refusal = answer
    r.keep_alive = False
    return r


@mypyc_attr(allow_interpreted_subclasses=True)
class ClientConnection:
    """What a request asks of the client connection it came on (``connection.ServerConnection``): a narrow
    interface, so that the request never touches the connection's state and the two modules do not import
    each other."""

    loop: asyncio.AbstractEventLoop
    client_ip: bytes
    client_host: str  # the same, as a string (the door's exempt_cidrs)
    last_activity: float  # the loop time the callback that got here read
    write_paused: bool  # the client's socket is backed up (a response streamed to it holds its upstream back)

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

    def write_body(self, chunk: bytes, chunked: bool) -> None:
        """Write a piece of a response body as it comes from the upstream (framed as a chunk when
        ``chunked``)."""
        raise NotImplementedError

    def writable(self) -> bool:
        """Is the client still there to write to?"""
        raise NotImplementedError

    def send_continue(self) -> None:
        """``100 Continue``: the client may send the body it announced."""
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
        self.pools: dict[str, EndpointPools] = {}  # by upstream: its pools, one per address
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
            pools = self.upstream_pools(target.upstream)
            policy = self.services.policy(target.policy)
            upstream = self.services.upstream(target.upstream)
            meters = self.telemetry.metrics.meters(self.name, target.upstream)
            way = Way(self.services, self.name, "http", policy, upstream, meters)
            plan = Plan(policy, upstream, target.retry_non_idempotent, pools, meters, way)
            self.plans[id(target)] = plan
        return plan

    def upstream_pools(self, upstream: str) -> EndpointPools:
        """``upstream``'s pools, which hear when an address leaves its set."""
        pools = self.pools.get(upstream)
        if pools is None:
            pools = self.pools[upstream] = EndpointPools()
            self.services.upstream(upstream).endpoints.watch(pools)
        return pools

    def all_pools(self) -> list[Pool]:
        return [p for pools in self.pools.values() for p in pools.all()]

    # -- one request -----------------------------------------------------------------------------------
    def begin(self, req: IncomingRequest, conn: ClientConnection) -> None:
        """Start forwarding ``req``; ``conn.request_done(req)`` follows once it is answered (perhaps at once)."""
        url = req.url
        authority: bytes | None = None
        if (url and url[0] == 47) or url == b"*":  # origin-form ("/..."; url[0] is an int, no slice made)
            target_url = url
            target = self._route(req) if self.router.routes else self.router.fallback
        else:  # proxy-form: ``http://host[:port]/...``
            found = self._proxy_target(req, conn)
            if found is None:
                return  # refused (400, 403) and answered
            target, target_url, authority = found
        plan = self._plan_of(target)
        rh = self._head(req, conn, plan, target_url, authority)
        if rh is None:
            return  # refused (400) and answered
        body = req.body
        method = "GET" if req.method == b"GET" else _METHODS.get(req.method) or req.method.decode("latin-1")
        may_retry = req.idempotent or plan.retry_non_idempotent
        if body is not None:
            body.restrict(plan.replay_limit)
        attempter = Attempter(conn.loop, plan, body, req.head_request, rh.head, rh.host is None, may_retry)
        reads = plan.tickets and req.method in READS  # (looked up only where a ticket is taken)
        fwd = Forwarding(self, req, conn, attempter, self._timers(conn))
        if not begin(
            self.services,
            plan.way,
            fwd,  # told whether it was refused (and answered), or begun
            name=method,
            client=conn.client_host,
            arrival=req.began,
            now=conn.last_activity,  # the loop time the callback that got here read, as loop.time() would say
            loop=conn.loop,
            received=parse_timeout_ms(rh.deadline) if rh.deadline is not None else None,  # the client's
            exempt=self.door is not None and self.door.exemptions and self._path_exempt(target_url),
            kind=_READ if reads else _WRITE,
            attributes=self._attributes(
                method, target_url, rh.client_host if authority is None else authority
            ),
            parent=rh.trace,
            # Envoy's rule: the per-try timeout and the sidecar's own deadline start once the whole request is
            # upstream; an upload still arriving is not the upstream's time (the client's deadline still counts).
            request_complete=body is None or body.complete,
            replayable=body is None or body.replayable,
            retry_on=None if may_retry else plan.connect_only,
        ):
            conn.request_done(req)
            return
        fwd.go(conn.last_activity)

    def _plan_of(self, target: Target) -> Plan:
        last = self._last_plan
        if target is self._last_target and last is not None:  # most requests go where the one before went
            return last
        plan = self.plans.get(id(target)) or self.plan(target)
        self._last_target, self._last_plan = target, plan
        return plan

    def _head(
        self,
        req: IncomingRequest,
        conn: ClientConnection,
        plan: Plan,
        target_url: bytes,
        authority: bytes | None,
    ) -> RequestHead | None:
        """The head to send upstream (``headers.request_head``); ``None``: its framing or Host is broken,
        answered 400 and the connection closed after it (nothing went upstream; what follows is suspect)."""
        body = req.body
        try:
            return request_head(
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
        except BadRequest as e:
            conn.close_after_answer()
            self._refuse(req, conn, answers.bad_head(str(e)))
            return None

    def _timers(self, conn: ClientConnection) -> Timers:
        timers = self.timers
        if timers is None:
            timers = self.timers = timers_for(conn.loop)
        return timers

    def _route(self, req: IncomingRequest) -> Target:
        host = find_header(req.headers, b"host")
        path = req.url.partition(b"?")[0].decode("latin-1")
        return self.router.route(host.decode("latin-1") if host else None, path)

    def _proxy_target(
        self, req: IncomingRequest, conn: ClientConnection
    ) -> tuple[Target, bytes, bytes | None] | None:
        """A proxy-form request's target, the request target to send upstream, and its authority. ``None``:
        refused, and answered."""
        url = req.url
        try:
            u: Any = httptools.parse_url(url)  # its fields may be None, whatever its stubs say
        except httptools.HttpParserInvalidURLError:
            self._refuse(req, conn, answers.malformed_target())
            return None
        if not u.schema or u.schema.lower() != b"http" or not u.host:  # RFC 9110 4.2.3: any case
            self._refuse(req, conn, answers.not_http_target())
            return None
        port = u.port or 80
        hostname = u.host.decode("latin-1")
        found = self.router.proxy(hostname, port, (u.path or b"/").decode("latin-1"))
        if found is None:
            self._refuse(req, conn, answers.not_proxied(hostname, port))
            return None
        target_url = (u.path or b"/") + (b"?" + u.query if u.query else b"")
        return found, target_url, u.host if u.port is None else b"%s:%d" % (u.host, u.port)

    def _attributes(self, method: str, target_url: bytes, host: bytes | None) -> dict[str, str | int] | None:
        """The request span's attributes (built only when there are spans; the console's tap takes the path,
        never the query string)."""
        if not self.tracing:
            if self.telemetry.tap is None:
                return None
            return {"url.path": target_url.partition(b"?")[0].decode("latin-1")}
        attrs: dict[str, str | int] = {
            "http.request.method": method,
            "url.path": target_url.partition(b"?")[0].decode("latin-1"),
            "url.scheme": "http",
        }
        if host:
            h, p = split_host(host.decode("latin-1"))
            attrs["server.address"] = h
            if p is not None:
                attrs["server.port"] = p
        return attrs

    def _path_exempt(self, target_url: bytes) -> bool:
        """Is the request's path one the door and the ticket gate never limit (``exempt_paths``)?"""
        door = self.door
        return door is not None and door.path_exempt(target_url.partition(b"?")[0].decode("latin-1"))

    def _is_self(self, host: bytes) -> bool:
        """Does ``Host`` name the sidecar itself (``127.0.0.1:15001``)? Then the upstream is told its own
        name instead; any other Host (a virtual host the app means) is passed on."""
        known = self._self_hosts.get(host)
        if known is None:
            value = host.decode("latin-1")
            if not valid_host(value):
                raise BadRequest(f"malformed Host header: {value!r}")
            h, port = split_host(value)
            known = h in _LOOPBACK or h == self.host.lower() and port in (None, self.port)
            if len(self._self_hosts) < 1024:
                self._self_hosts[host] = known
        return known

    def _refuse(self, req: IncomingRequest, conn: ClientConnection, answer: Answer) -> None:
        """The sidecar's own answer to a request it will not forward (400, 403: chosen by answer.py)."""
        self.rejected.reject(str(answer.status))
        write_answer(req, conn, answer)
        conn.request_done(req)


def write_answer(req: IncomingRequest, conn: ClientConnection, answer: Answer) -> None:
    """Write the sidecar's own ``answer`` to ``req`` (what is left of its body is discarded)."""
    keep = conn.keep_alive_after(req)
    if not keep:
        conn.close_after_answer()
    if req.body is not None and not req.body.complete:
        req.body.discard()
    conn.write(encode(answer, keep, head_only=req.head_request))


class Stage(IntEnum):
    """Where a request is in its life (``Forwarding.stage``; only the request changes it)::

        NEW ──refused (the door: answered)───────────────────────────────────────────────────► OVER
         └─begun─┬─(a token to wait for)─► QUEUED ──admitted─► DRIVING                          ▲
                 └─────────────────────────────────────────► DRIVING                             │
        QUEUED ──client_gone, refuse_body (answered) ───────────────────────────────────────────┤
        DRIVING ──finished: answered whole (or cancelled: client_gone) ──────────────────────────┤
        DRIVING ──finished: a response whose body is still coming─► STREAMING ──its end, break──┤
        DRIVING ──refuse_body─► REFUSING ──finished (cancelled: the refusal answered) ────────────┤
        STREAMING ──client_gone ─────────────────────────────────────────────────────────────────┘

    A step the machine does not have raises :class:`~sidecar.adapters.transitions.InvalidTransition`.
    """

    NEW = 0  # made by Forwarder.begin, not yet admitted
    QUEUED = 1  # admitted after a wait for a borrowed token: its driver starts when the token is due
    DRIVING = 2  # the engine drives its attempts
    REFUSING = 3  # its body stalled or broke: the attempts are being cancelled, the refusal answers it
    STREAMING = 4  # the chosen response is being written, its body passed on as it comes
    OVER = 5  # answered (or given up): the connection moved on


# Held as a plain int compared with Final literals (compiled, a C int compare; see sidecar/native.py).
_NEW: Final = 0
_QUEUED: Final = 1
_DRIVING: Final = 2
_REFUSING: Final = 3
_STREAMING: Final = 4
_OVER: Final = 5
assert tuple(Stage) == (_NEW, _QUEUED, _DRIVING, _REFUSING, _STREAMING, _OVER)


def _invalid(stage: int, event: str) -> InvalidTransition:
    return InvalidTransition("http request", Stage(stage).name.lower(), event)


class Forwarding(Admittee):
    """One request between ``begin`` and its complete answer: its :class:`Stage` and what each stage holds
    (``door``, ``wait``, ``wake`` while QUEUED; ``refusal`` while REFUSING; ``response`` while STREAMING).
    It is also the owner of the request's body (``replay.BodyOwner``) and the pipe its chosen response's body
    goes through (``upstream.Pipe``)."""

    __slots__ = (
        "forwarder",
        "req",
        "conn",
        "obs",
        "attempter",
        "driver",
        "stage",
        "response",
        "chunked",
        "refusal",
        "door",
        "wait",
        "wake",
        "timers",
        "began_complete",
    )

    obs: RequestObserver  # from ``begun`` on

    def __init__(
        self,
        forwarder: Forwarder,
        req: IncomingRequest,
        conn: ClientConnection,
        attempter: Attempter,
        timers: Timers,
    ) -> None:
        self.forwarder = forwarder
        self.req = req
        self.conn = conn
        self.attempter = attempter
        self.timers = timers
        self.stage: int = _NEW  # changed only by the methods below (see Stage)
        self.driver: Driver | None = None  # from ``begun`` until OVER
        self.response: UpstreamResponse | None = None  # STREAMING: the response being written
        self.chunked = False  # STREAMING: its body is framed in chunks for the client
        self.refusal: Answer | None = None  # REFUSING: the answer once the attempts are cancelled
        self.door: Door | None = None  # QUEUED: the door whose token it waits for, until ``wait.at``
        self.wait: Wait | None = None
        self.wake: TimerEntry | None = None
        self.began_complete = True  # QUEUED: the call was set up with the whole request received

    @property
    def streaming(self) -> bool:
        return self.stage == _STREAMING

    # -- on the way in (``admit.begin``) -----------------------------------------------------------------
    def refused(self, refusal: Refusal, obs: RequestObserver) -> None:
        """The door refused it: 429 or 503, and when to come back."""
        if self.stage != _NEW:
            raise _invalid(self.stage, "refused")
        self.stage = _OVER
        answer = refusal_answer(refusal)
        write_answer(self.req, self.conn, answer)
        obs.set_attribute("http.response.status_code", answer.status)

    def begun(
        self, call: Call, obs: RequestObserver, gate: AttemptGate | None, door: Door | None, wait: Wait | None
    ) -> None:
        """Admitted: its driver is made; it starts at once (``go``) or when its token is due (QUEUED)."""
        if self.stage != _NEW:
            raise _invalid(self.stage, "begun")
        self.obs = obs
        self.attempter.obs = obs
        body = self.req.body
        if body is not None:
            body.owner = self  # the one place a body's hooks are installed
        self.conn.answering(self)
        self.driver = Driver(call, self.attempter, obs, self, self.conn.loop, self.timers, gate)
        if wait is not None and door is not None:
            self.stage = _QUEUED
            self.door = door
            self.wait = wait
            self.began_complete = body is None or body.complete
            self.wake = self.timers.call_at(wait.at, self.admitted)
        else:
            self.stage = _DRIVING

    def go(self, now: float) -> None:
        """The driver starts now, unless the request waits for its token (it starts when that is due)."""
        stage, driver = self.stage, self.driver
        if stage == _DRIVING and driver is not None:
            driver.start(now)
        elif stage != _QUEUED:
            raise _invalid(stage, "go")

    def admitted(self) -> None:
        """QUEUED: the token is due, the request goes ahead."""
        wait, door, driver = self.wait, self.door, self.driver
        if self.stage != _QUEUED or wait is None or door is None or driver is None:
            raise _invalid(self.stage, "admitted")
        self.stage = _DRIVING
        self.wait = self.wake = None
        self.door = None
        now = self.conn.loop.time()
        door.admitted(wait, now)
        driver.start(now)
        if not self.began_complete and self.req.body_complete and driver.finish is None:
            driver.request_complete(now)

    def _leave_queue(self) -> None:
        """QUEUED, and it stops waiting (the client went away, or its body stalled): the token goes back."""
        wait, wake, door = self.wait, self.wake, self.door
        self.wait = self.wake = None
        self.door = None
        if wake is not None:
            self.timers.cancel(wake)
        if door is not None and wait is not None:
            door.interrupted(wait)

    def _over(self) -> None:
        """The answer is complete (OVER): on to the connection's next request. The references that tie this
        request's objects into cycles are dropped, so they are freed at once rather than by the collector."""
        self.stage = _OVER
        self.driver = None
        self.attempter.ctx = None
        self.conn.request_done(self.req)

    # -- the request body (replay.BodyOwner) ------------------------------------------------------------
    def body_attached(self) -> None:
        """The first attempt takes the body: a client that waits for ``100 Continue`` is told to send it."""
        if self.req.expect_continue:
            self.conn.send_continue()

    def body_overflowed(self) -> None:
        self.attempter.body_overflowed()

    def body_complete(self) -> None:
        """The client's whole body has arrived and gone to the attempts in flight: their clocks start (a
        QUEUED request's driver is told when it starts)."""
        driver = self.driver
        if self.stage == _DRIVING and driver is not None:
            driver.request_complete()

    def body_stalled(self, timeout: float) -> None:
        """Nothing of the request body came for ``request_body_timeout``: abandon the attempts, answer 408,
        close (the rest of the body will not be read)."""
        if not self.refuse_body(answers.body_stalled(timeout)):
            self.conn.close()  # answered already: the connection cannot carry another request

    def refuse_body(self, answer: Answer) -> bool:
        """The request body stalled or broke its framing: abandon the attempts (an upstream never sees the
        request complete) or leave the door's queue, answer, close. False: too late, the answer is on its
        way (or given)."""
        stage = self.stage
        if stage == _QUEUED:  # no driver started: answered here
            self._leave_queue()
            self._answer_refusal(answer)
            return True
        driver = self.driver
        if stage != _DRIVING or driver is None:
            return False
        self.stage = _REFUSING
        self.refusal = answer
        driver.client_gone()  # -> finished(cancelled), answered there
        return True

    def client_gone(self) -> None:
        """The client disconnected: stop the attempts, or the response being streamed."""
        stage = self.stage
        if stage == _QUEUED:
            self._leave_queue()
            self.obs.end("client went away")
            self._over()
        elif stage == _DRIVING and self.driver is not None:
            self.driver.client_gone()  # -> finished(cancelled)
        elif stage == _STREAMING:
            resp = self.response
            self.response = None
            if resp is not None:
                resp.abort()  # what the upstream connection says as it is dropped is not news
            log.info("client went away before its response was complete")
            self.obs.end("client went away")
            self._over()

    # -- the engine is done (``runtime.CallOwner``) -------------------------------------------------------
    def finished(self, finish: Finish, payload: Any) -> None:
        """The engine is done: answer the client (the chosen upstream response, or the sidecar's own)."""
        stage = self.stage
        if stage != _DRIVING and stage != _REFUSING:
            raise _invalid(stage, "finished")
        try:
            self._answer(finish, payload)
        except Exception:
            log.exception("answering a request failed")
            self.stage = _OVER
            self.obs.end("internal error")
            self.conn.abort_request(self.req)

    def _answer(self, finish: Finish, payload: Any) -> None:
        req, conn, obs = self.req, self.conn, self.obs
        if finish.reason is _CANCELLED:
            if payload is not None:
                self.attempter.discard(payload)
            refusal = self.refusal
            if self.stage == _REFUSING and refusal is not None:
                self._answer_refusal(refusal)
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
            plan = self.attempter.plan
            answer = for_finish(finish, plan.expired_status, plan.upstream_name)
            if answer is not None:
                write_answer(req, conn, answer)
                obs.set_attribute("http.response.status_code", answer.status)
            obs.end(None if answer is None or answer.status < 500 else answer.body.decode().strip())
            self._over()
            return
        obs.set_attribute("http.response.status_code", resp.status)
        self._deliver(resp)

    def _answer_refusal(self, answer: Answer) -> None:
        """Answer the body's refusal (``refuse_body``) and close the connection after it."""
        self.forwarder.rejected.reject(str(answer.status))
        self.conn.close_after_answer()
        write_answer(self.req, self.conn, answer)
        self.obs.set_attribute("http.response.status_code", answer.status)
        self.obs.end(answers.message(answer))
        self._over()

    def _refused(self, finish: Finish, refusal: Refusal) -> None:
        """The request ends on an attempt that got no ticket (``gates/ticket_gate.py``): 503 and when to come
        back; unless the client's deadline ended it, which is answered as such (``admit.ticket_refusal``)."""
        req, conn, obs = self.req, self.conn, self.obs
        answer: Answer | None
        if ticket_refusal(finish, refusal) is None:
            answer = for_finish(finish, self.attempter.plan.expired_status)
        else:
            answer = refusal_answer(refusal)
            obs.refused(refusal)
        if answer is not None:
            write_answer(req, conn, answer)
            obs.set_attribute("http.response.status_code", answer.status)
        obs.end(refusal.message)
        self._over()

    # -- the chosen response ----------------------------------------------------------------------------
    def _deliver(self, resp: UpstreamResponse) -> None:
        """Write the chosen response: its head and what arrived of its body at once, then the rest as it
        comes (STREAMING, this request the response's pipe)."""
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
            self._delivered(resp, resp.error is None)
            return
        conn.write(b"".join(lines))
        if not conn.writable():
            self._delivered(resp, False)
            return
        self.stage = _STREAMING
        self.response = resp
        self.chunked = chunked
        resp.stream_to(self)
        if conn.write_paused:
            resp.pause_upstream()
        else:
            resp.resume_upstream()

    # the response's pipe (upstream.Pipe), STREAMING
    def response_data(self, chunk: bytes) -> None:
        self.conn.write_body(chunk, self.chunked)

    def response_end(self) -> None:
        if self.chunked:
            self.conn.write(b"0\r\n\r\n")
        self._streamed(True)

    def response_broke(self, why: str) -> None:
        log.info("response from upstream broke off: %s", why)
        self._streamed(False)

    # the client's flow control, reaching back to the upstream socket
    def client_paused(self) -> None:
        if self.stage == _STREAMING and self.response is not None:
            self.response.pause_upstream()

    def client_resumed(self) -> None:
        if self.stage == _STREAMING and self.response is not None:
            self.response.resume_upstream()

    def upstream_silent(self, why: str) -> None:
        """STREAMING, and the upstream sent nothing for the listener's ``idle_timeout``: give up on it."""
        if self.stage == _STREAMING and self.response is not None:
            self.response.failed(why)  # -> response_broke

    def _streamed(self, ok: bool) -> None:
        resp = self.response
        if self.stage != _STREAMING or resp is None:
            raise _invalid(self.stage, "response over")
        self.response = None
        self._delivered(resp, ok)

    def _delivered(self, resp: UpstreamResponse, ok: bool) -> None:
        """The response went out whole (``ok``) or broke off."""
        resp.release()
        if not ok:
            self.conn.close()
        self.obs.end(None if ok else "upstream response broke off")
        self._over()
