"""One attempt of a command at one upstream server (the runtime's ``Attempter``): set this attempt's
``maxTimeMS``, take a pooled connection, send, read the reply whole, classify it (``classify.py``) and report.

Messages the sidecar passes on to every server without an engine (``endSessions``: the app already has its
answer, nothing is retried) go out here too (:class:`PassOn`).

A server that failed (unreachable, a broken connection, "not primary") is marked in the topology and the
result reported at once: the engine decides, and a retry that finds no server fitting yet (an election) waits
for one on the engine's own timer (``upstream.balancer.FittingPicker.ready_at``), not hidden inside this attempt.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from bson.errors import InvalidBSON
from bson.raw_bson import RawBSONDocument

from ...policy import SendAttempt
from ...policy.deadline import timeout_ms
from ...runtime import AttemptContext, AttemptResult
from ...telemetry.observer import RequestObserver
from . import wire
from .classify import Failure, classify_failure, classify_reply, classify_sent, server_changed
from .commands import RAW, Command
from .compression import NEVER
from .patch import PatchError, set_number
from .topology import Topology
from .upstream import ConnectFailure, Pools


@dataclass(slots=True)
class Reply:
    """An upstream's reply: the endpoint that gave it, the OP_MSG, its body."""

    endpoint: str
    msg: wire.Msg
    body: RawBSONDocument


class Attempt:
    """The attempter for one command (see ``sidecar.runtime.Attempter``)."""

    __slots__ = ("pools", "topology", "cmd", "msg", "obs")

    def __init__(
        self,
        pools: Pools,
        topology: Topology,
        cmd: Command,
        msg: wire.Msg,
        obs: RequestObserver,
    ) -> None:
        self.pools = pools
        self.topology = topology
        self.cmd = cmd
        self.msg = msg
        self.obs = obs

    def _message(self, sa: SendAttempt) -> tuple[int, bytes, bool]:
        msg, cmd = self.msg, self.cmd
        sections = msg.sections
        max_time = False
        if math.isfinite(sa.timeout) and (cmd.max_time_ms is not None or cmd.accepts_added_max_time):
            body = set_number(msg.body, "maxTimeMS", max(1, timeout_ms(sa.timeout)))
            sections = tuple((0, body) if kind == 0 else (kind, raw) for kind, raw in sections)
            max_time = True
        rid = wire.next_request_id()
        return rid, wire.encode_msg(rid, 0, msg.flags & wire.MORE_TO_COME, sections), max_time

    async def send(self, sa: SendAttempt, ctx: AttemptContext) -> AttemptResult:
        cmd, topology = self.cmd, self.topology
        try:
            rid, message, max_time = self._message(sa)
        except PatchError as e:  # bson already read the body whole, so this is not expected
            f = Failure("request", f"cannot set maxTimeMS on this command: {e}")
            return AttemptResult(classify_failure(f, cmd), f)
        pool = self.pools.get(sa.endpoint)
        try:
            conn = await pool.acquire()
        except ConnectFailure as e:
            f = Failure(e.stage, e.message)
            if e.stage == "connect":  # unreachable: route around it until its monitor sees it again
                topology.mark_unknown(sa.endpoint, e.message)
            return AttemptResult(classify_failure(f, cmd), f)
        try:
            compressible = cmd.name not in NEVER
            if self.msg.more_to_come:
                await conn.send(message, compressible)
                pool.release(conn)
                return AttemptResult(classify_sent(), None)
            header, payload = await conn.roundtrip(message, rid, compressible)
            reply = wire.parse_msg(payload, header)
            body = RawBSONDocument(reply.body, RAW)
            body.get("ok")  # inflate now: a malformed body is the connection's fault, not the app's
        except asyncio.CancelledError:
            pool.discard(conn)
            raise
        except (OSError, asyncio.IncompleteReadError, wire.ProtocolError, InvalidBSON) as e:
            pool.discard(conn)
            pool.clear()
            f = Failure("network", _describe(e))
            topology.request_check(sa.endpoint)
            return AttemptResult(classify_failure(f, cmd), f)
        pool.release(conn)
        outcome = classify_reply(body, cmd, max_time)
        if not outcome.ok:
            code = body.get("code")
            if code is not None:
                self.obs.set_attempt_attribute(sa.attempt, "db.response.status_code", str(code))
            if server_changed(code):
                topology.mark_unknown(sa.endpoint, f"answered code {code}")
        return AttemptResult(outcome, Reply(sa.endpoint, reply, body))

    def discard(self, payload: Any) -> None:
        pass  # replies are read whole and their connections already returned


class PassOn:
    """Passes a message on to servers in the background, each copy on a pooled connection of its own, for
    at most ``timeout`` seconds; the replies are read and dropped, and a failure only closes its connection.
    ``cancel`` (the listener stops) ends the ones still out."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._tasks: set[asyncio.Task[None]] = set()

    def send(self, pools: Pools, endpoints: list[str], msg: wire.Msg) -> None:
        loop = asyncio.get_running_loop()
        for endpoint in endpoints:
            task = loop.create_task(self._one(pools, endpoint, msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _one(self, pools: Pools, endpoint: str, msg: wire.Msg) -> None:
        pool = pools.get(endpoint)
        try:
            conn = await pool.acquire()
        except Exception:
            return
        rid = wire.next_request_id()
        try:
            async with asyncio.timeout(self.timeout):
                await conn.roundtrip(wire.encode_msg(rid, 0, 0, msg.sections), rid, compressible=True)
        except BaseException:
            pool.discard(conn)
            return
        pool.release(conn)

    def cancel(self) -> None:
        for t in list(self._tasks):
            t.cancel()


def _describe(e: BaseException) -> str:
    if isinstance(e, asyncio.IncompleteReadError):
        return "the upstream closed the connection before replying"
    return str(e) or type(e).__name__
