"""The HTTP adapter's state machines, each walked through every step it has, and a step it does not have
raised at once (a bug, never swallowed): the request (``request.Stage``), the client connection
(``connection.State`` and ``connection.Reading``) and the upstream connection (``upstream.State``).

No sockets: the connections are given stand-in transports that record what is written, and the upstream
is a name nobody resolved (discovery is not started), so a request the engine drives ends at once on
``no-endpoint`` instead of connecting anywhere. The engine's other endings are told to the request as the
driver tells them (``finished``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sidecar.adapters.http import answer
from sidecar.adapters.http.connection import ConnectionOwner, Reading, ServerConnection, State
from sidecar.adapters.http.replay import RequestBody
from sidecar.adapters.http.request import ClientConnection, Forwarder, Forwarding, IncomingRequest, Stage
from sidecar.adapters.http.upstream import Exchange, Pool, UpstreamConnection, UpstreamGone, UpstreamResponse
from sidecar.adapters.http.upstream import State as Up
from sidecar.adapters.transitions import InvalidTransition
from sidecar.admit import begin
from sidecar.config import load_dict
from sidecar.policy import Finish, Outcome, OutcomeClass, Reason
from sidecar.services import Services
from sidecar.telemetry import Telemetry

GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


class Transport:
    """Stands in for a socket's transport: records what the connection writes and asks."""

    def __init__(self) -> None:
        self.out = b""
        self.closed = self.aborted = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.out += data

    def writelines(self, parts: Any) -> None:
        self.out += b"".join(parts)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default


def services(admission: bool = False) -> Services:
    """An HTTP listener ``web`` in front of ``api``, whose name is never resolved here (no endpoint); with
    ``admission``, a door that holds one token and makes the next request wait 1000 s for another."""
    cfg: dict[str, Any] = {
        "admin": {"listen": None},
        "upstreams": {"api": {"endpoints": ["api.invalid:80"]}},
        "listeners": [{"name": "web", "protocol": "http", "listen": "127.0.0.1:0", "upstream": "api"}],
    }
    if admission:
        cfg["admission"] = {
            "front": {"requests": {"rate": 0.001, "burst": "1000s", "max_queue": 8, "max_wait": "none"}}
        }
        cfg["listeners"][0]["admission"] = "front"
    config = load_dict(cfg)
    return Services(config, Telemetry(config.telemetry))


class Owner(ConnectionOwner):
    """The listener, as a client connection sees it."""

    def __init__(self, svc: Services) -> None:
        self.forwarder = Forwarder(svc.config.listeners[0], svc)  # type: ignore[arg-type]
        self.forwarder.bind(asyncio.get_running_loop(), ("127.0.0.1", 15001))
        self.replay_limit = 1 << 20
        self.buffers = svc.buffers
        self.max_header_size = 8192
        self.stopping = False
        self.refusals: list[int] = []

    def connection_opened(self, conn: ServerConnection) -> None:
        pass

    def connection_closed(self, conn: ServerConnection) -> None:
        pass

    def connection_idle(self, conn: ServerConnection) -> None:
        pass

    def refused(self, status: int) -> None:
        self.refusals.append(status)


def client(svc: Services) -> tuple[ServerConnection, Transport, Owner]:
    owner = Owner(svc)
    conn = ServerConnection(owner, asyncio.get_running_loop())
    transport = Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport, owner


def drain_door(svc: Services) -> None:
    """Spend the door's one token: the next request waits (QUEUED)."""
    door = svc.door("web")
    assert door is not None and door.request(asyncio.get_running_loop().time()) is None


# -- the client connection ---------------------------------------------------------------------------------
async def test_client_connection_states() -> None:
    svc = services(admission=True)
    drain_door(svc)
    conn, transport, _ = client(svc)
    assert conn.state == State.IDLE and not conn.busy
    with pytest.raises(InvalidTransition, match="answered is not a transition from state 'idle'"):
        conn.request_done(IncomingRequest(0.0))  # nothing is being answered
    conn.data_received(GET)  # IDLE -start-> BUSY: queued at the door
    assert conn.state == State.BUSY and conn.busy
    with pytest.raises(InvalidTransition, match="start answering is not a transition from state 'busy'"):
        conn._start()  # one request answered at a time
    conn.close_after_answer()  # BUSY -> LAST
    assert conn.state == State.LAST
    assert conn.active is not None
    conn.active.client_gone()  # it leaves the queue: answered (given up) -> CLOSING, then closed
    assert conn.state == State.CLOSING and transport.closed
    conn.connection_lost(None)  # -> CLOSED
    assert conn.state == State.CLOSED and conn.closed
    conn.request_done(IncomingRequest(0.0))  # after the loss: nothing left to answer, no error


async def test_client_connection_keep_alive_and_a_refusal() -> None:
    svc = services(admission=True)
    drain_door(svc)
    conn, transport, owner = client(svc)
    # IDLE -> BUSY -> IDLE: a request that cannot wait for its token within its deadline is refused at once
    conn.data_received(b"GET / HTTP/1.1\r\nHost: x\r\nX-YaTaxi-Client-TimeoutMs: 1000\r\n\r\n")
    assert transport.out.startswith(b"HTTP/1.1 429 ") and conn.state == State.IDLE
    # IDLE -> CLOSING -> LAST: a malformed request is refused after what is queued (nothing), then closed
    conn.data_received(b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n")
    assert owner.refusals == [400] and conn.state == State.LAST and transport.closed
    assert b"HTTP/1.1 400 " in transport.out and b"must end in chunked" in transport.out
    conn.connection_lost(None)
    assert conn.state == State.CLOSED


async def test_client_connection_reading_states() -> None:
    svc = services(admission=True)
    drain_door(svc)
    conn, _, _ = client(svc)
    assert conn.reading == Reading.HEAD
    conn.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab")  # HEAD -> BODY
    assert conn.reading == Reading.BODY
    with pytest.raises(InvalidTransition, match="head parsed is not a transition from state 'body'"):
        conn._head_parsed()
    conn.data_received(b"cde")  # BODY -> HEAD: the message is complete
    assert conn.reading == Reading.HEAD
    assert conn.eof_received()  # -> DONE: the client sends nothing more; its request is still answered
    assert conn.reading == Reading.DONE and conn.state == State.BUSY
    conn.connection_lost(None)  # its request leaves the door's queue


# -- the request -------------------------------------------------------------------------------------------
class Client(ClientConnection):
    """The connection a request came on, as the request sees it: what it was asked to do."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.client_ip = b"127.0.0.1"
        self.client_host = "127.0.0.1"
        self.last_activity = self.loop.time()
        self.write_paused = False
        self.out = b""
        self.done: list[IncomingRequest] = []
        self.closing = False

    def answering(self, fwd: Forwarding) -> None:
        self.active = fwd

    def keep_alive_after(self, req: IncomingRequest) -> bool:
        return not self.closing

    def close_after_answer(self) -> None:
        self.closing = True

    def write(self, data: bytes) -> None:
        self.out += data

    def write_body(self, chunk: bytes, chunked: bool) -> None:
        self.out += chunk

    def writable(self) -> bool:
        return True

    def send_continue(self) -> None:
        self.out += b"HTTP/1.1 100 Continue\r\n\r\n"

    def request_done(self, req: IncomingRequest) -> None:
        self.done.append(req)

    def abort_request(self, req: IncomingRequest) -> None:
        raise AssertionError("no request fails here")

    def close(self) -> None:
        self.closing = True


def forwarding(svc: Services, body: bytes | None = None) -> tuple[Forwarding, Client]:
    """A request as ``Forwarder.begin`` makes it, admitted (``admit.begin``), its driver not started yet."""
    from sidecar.adapters.http.attempt import Attempter

    forwarder = Forwarder(svc.config.listeners[0], svc)  # type: ignore[arg-type]
    conn = Client()
    req = IncomingRequest(conn.loop.time())
    req.method, req.url = (b"GET", b"/") if body is None else (b"POST", b"/")
    if body is not None:
        req.body = RequestBody(len(body), 1 << 20, conn, svc.buffers)  # type: ignore[arg-type]
    plan = forwarder.plan(forwarder.router.fallback)
    attempter = Attempter(conn.loop, plan, req.body, False, b"GET / HTTP/1.1\r\n", True, True)
    fwd = Forwarding(forwarder, req, conn, attempter, forwarder._timers(conn))
    assert fwd.stage == Stage.NEW
    now = conn.loop.time()
    assert begin(svc, plan.way, fwd, name="GET", client="127.0.0.1", arrival=now, now=now, loop=conn.loop)
    return fwd, conn


def response(complete: bool) -> UpstreamResponse:
    pool = Pool("api.invalid:80", "api.invalid", 80, 1.0, 4)
    up = UpstreamConnection(pool)
    up.connection_made(Transport())  # type: ignore[arg-type]
    r = UpstreamResponse(200, b"OK", [], 2 if complete else None, not complete, False, True, up, 1)
    if complete:
        r.body(b"ok")
        r.finished()
    return r


SUCCESS = Outcome(OutcomeClass.SUCCESS, detail="200")


async def test_request_driven_to_its_answer() -> None:
    svc = services()
    fwd, conn = forwarding(svc)  # NEW -begun-> DRIVING
    assert fwd.stage == Stage.DRIVING
    with pytest.raises(InvalidTransition, match="begun is not a transition from state 'driving'"):
        fwd.begun(fwd.driver.call, fwd.obs, None, None, None)  # type: ignore[union-attr]
    fwd.finished(Finish(Reason.SUCCESS, 1, SUCCESS, 1), response(complete=True))  # -> OVER, answered whole
    assert fwd.stage == Stage.OVER and conn.out.startswith(b"HTTP/1.1 200 OK\r\n") and conn.done == [fwd.req]
    with pytest.raises(InvalidTransition, match="finished is not a transition from state 'over'"):
        fwd.finished(Finish(Reason.SUCCESS, 1, SUCCESS, 1), None)  # the engine finishes once

    fwd, conn = forwarding(svc)
    fwd.go(conn.loop.time())  # the driver starts: no endpoint, answered 503 at once -> OVER
    assert fwd.stage == Stage.OVER and conn.out.startswith(b"HTTP/1.1 503 ")


async def test_request_streaming_its_response() -> None:
    svc = services()
    fwd, conn = forwarding(svc)
    resp = response(complete=False)
    fwd.finished(Finish(Reason.SUCCESS, 1, SUCCESS, 1), resp)  # DRIVING -> STREAMING
    assert fwd.stage == Stage.STREAMING and resp.pipe is fwd
    resp.body(b"hello")
    resp.finished()  # -> OVER
    assert fwd.stage == Stage.OVER and conn.out.endswith(b"hello0\r\n\r\n") and resp.pipe is None
    with pytest.raises(InvalidTransition, match="response over is not a transition from state 'over'"):
        fwd.response_end()

    fwd, conn = forwarding(svc)
    resp = response(complete=False)
    fwd.finished(Finish(Reason.SUCCESS, 1, SUCCESS, 1), resp)
    resp.failed("upstream connection lost mid-body")  # STREAMING -> OVER, the client's connection closed
    assert fwd.stage == Stage.OVER and conn.closing

    fwd, conn = forwarding(svc)
    resp = response(complete=False)
    fwd.finished(Finish(Reason.SUCCESS, 1, SUCCESS, 1), resp)
    fwd.client_gone()  # STREAMING -> OVER: the response is dropped, its pipe hears nothing more
    assert fwd.stage == Stage.OVER and resp.pipe is None and resp.conn is None


async def test_request_client_gone_and_body_refused_while_driving() -> None:
    svc = services()
    fwd, conn = forwarding(svc)
    fwd.client_gone()  # DRIVING -> (the engine finishes cancelled) -> OVER, nothing written
    assert fwd.stage == Stage.OVER and conn.out == b"" and conn.done == [fwd.req]

    fwd, conn = forwarding(svc, body=b"hello")
    assert fwd.refuse_body(answer.body_stalled(5))  # DRIVING -> REFUSING -> (cancelled) -> OVER, 408
    assert fwd.stage == Stage.OVER and conn.out.startswith(b"HTTP/1.1 408 ") and conn.closing
    assert not fwd.refuse_body(answer.body_stalled(5))  # too late: answered


async def test_request_queued_at_the_door() -> None:
    svc = services(admission=True)
    drain_door(svc)
    conn, transport, _ = client(svc)
    conn.data_received(GET)  # NEW -begun-> QUEUED
    fwd = conn.active
    assert fwd is not None and fwd.stage == Stage.QUEUED
    with pytest.raises(InvalidTransition, match="finished is not a transition from state 'queued'"):
        fwd.finished(Finish(Reason.SUCCESS, 1, SUCCESS, 1), None)
    fire(fwd.wake)  # the token is due: -> DRIVING, and the driver ends it at once (no endpoint) -> OVER
    assert fwd.stage == Stage.OVER and transport.out.startswith(b"HTTP/1.1 503 ")
    with pytest.raises(InvalidTransition, match="admitted is not a transition from state 'over'"):
        fwd.admitted()

    conn.data_received(GET)  # QUEUED, then its client goes: OVER, the token goes back
    fwd = conn.active
    assert fwd is not None and fwd.stage == Stage.QUEUED
    conn.connection_lost(None)
    assert fwd.stage == Stage.OVER

    conn, transport, _ = client(svc)
    conn.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab")
    fwd = conn.active
    assert fwd is not None and fwd.stage == Stage.QUEUED
    fwd.body_stalled(5)  # QUEUED -> OVER: 408, and the connection closes after it
    assert fwd.stage == Stage.OVER and transport.out.startswith(b"HTTP/1.1 408 ") and transport.closed


def fire(entry: Any) -> None:
    """Fire a wake-up of the loop's timer heap now, as ``timers.Timers`` does when it is due."""
    callback, entry[2] = entry[2], None
    callback()


async def test_request_refused_at_the_door() -> None:
    svc = services(admission=True)
    drain_door(svc)
    conn, transport, _ = client(svc)
    conn.data_received(b"GET / HTTP/1.1\r\nHost: x\r\nX-YaTaxi-Client-TimeoutMs: 1000\r\n\r\n")  # NEW -> OVER
    assert transport.out.startswith(b"HTTP/1.1 429 ") and conn.active is None and conn.state == State.IDLE


# -- the upstream connection -------------------------------------------------------------------------------
class Heard(Exchange):
    def __init__(self) -> None:
        self.responses: list[UpstreamResponse] = []
        self.gone: list[UpstreamGone] = []

    def on_response(self, response: UpstreamResponse) -> None:
        self.responses.append(response)

    def on_gone(self, error: UpstreamGone) -> None:
        self.gone.append(error)


class Control:
    def pause_body(self) -> None: ...
    def resume_body(self) -> None: ...
    def pause_budget(self) -> None: ...
    def resume_budget(self) -> None: ...


def upstream_connection(pool: Pool) -> tuple[UpstreamConnection, Transport]:
    conn = UpstreamConnection(pool)  # as the pool makes one: held by whoever asked for it
    transport = Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    pool.count += 1
    return conn, transport


async def test_upstream_connection_states() -> None:
    pool = Pool("e:80", "e", 80, 5.0, 4)
    conn, transport = upstream_connection(pool)
    assert conn.state == Up.HELD
    with pytest.raises(InvalidTransition, match="taken is not a transition from state 'held'"):
        conn.taken()
    conn.release()  # HELD -> POOLED (unused)
    assert conn.state == Up.POOLED and pool.idle == [conn]
    with pytest.raises(InvalidTransition, match="release is not a transition from state 'pooled'"):
        conn.release()  # back once only
    with pytest.raises(InvalidTransition, match="start is not a transition from state 'pooled'"):
        conn.start(b"GET / HTTP/1.1\r\n\r\n", None, False, 1, Heard())
    assert pool.take_idle() is conn and conn.state == Up.HELD  # POOLED -taken-> HELD

    heard = Heard()
    conn.start(b"GET / HTTP/1.1\r\n\r\n", None, False, 1, heard)  # HELD -> SENT (no body)
    assert conn.state == Up.SENT and transport.out == b"GET / HTTP/1.1\r\n\r\n"
    with pytest.raises(InvalidTransition, match="start is not a transition from state 'sent'"):
        conn.start(b"GET / HTTP/1.1\r\n\r\n", None, False, 2, Heard())  # one exchange at a time
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # over, cleanly: -> POOLED
    assert [r.status for r in heard.responses] == [200] and conn.state == Up.POOLED and pool.idle == [conn]
    heard.responses[0].release()  # the response's holder lets go: the connection went back already

    assert pool.take_idle() is conn
    body = RequestBody(5, 1 << 20, Control(), svc_budget())
    conn.start(b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n", body, False, 3, Heard())  # HELD -> SENDING
    assert conn.state == Up.SENDING
    body.feed(b"hello")
    body.end()  # SENDING -> SENT
    assert conn.state == Up.SENT and transport.out.endswith(b"hello")
    conn.release()  # given up before its response: -> CLOSED
    assert conn.state == Up.CLOSED and transport.aborted and pool.count == 0
    conn.release()  # closed: nothing to give back
    assert conn.state == Up.CLOSED

    other, transport = upstream_connection(pool)
    other.release()
    other.data_received(b"HTTP/1.1 200 OK\r\n")  # bytes while pooled: the upstream is confused -> CLOSED
    assert other.state == Up.CLOSED and transport.aborted and pool.idle == []

    lost, _ = upstream_connection(pool)
    heard = Heard()
    lost.start(b"GET / HTTP/1.1\r\n\r\n", None, False, 1, heard)
    lost.connection_lost(ConnectionResetError())  # -> CLOSED, the exchange hears why
    assert lost.state == Up.CLOSED and "connection reset before the response" in heard.gone[0].detail


def svc_budget() -> Any:
    from sidecar.buffer_budget import BufferBudget

    return BufferBudget(1 << 30)
