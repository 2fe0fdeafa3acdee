"""One command from the app, carried to the upstream under the policy: routing (read preference, cursor and
transaction pins), each attempt's ``maxTimeMS``, classification, and the one answer the app gets.

How each way a request ends becomes the app's answer (``Finish.reason`` -> reply):

=====================================  =========================================================================
success, not-retryable, attempts-      the delivered attempt's reply (the previous attempt's when the last one
exhausted, throttled, pushback-no-     said ``NoWritesPerformed``), with ``RetryableError``/``RetryableWriteError``
retry                                  removed unless ``final_error_labels: keep``; a failure without a reply
                                       becomes the sidecar's error document (``replies.py``)
deadline (the app's maxTimeMS), the    that error (a backoff would have crossed the deadline, or the upstream
last attempt's own error               said its maxTimeMS expired)
deadline (the policy's default: the    the last reply received, whichever attempt gave it
app sent no maxTimeMS), a reply came
deadline, otherwise                    code 50 MaxTimeMSExpired (the deadline passed before any attempt, or
                                       while one was out)
internal-error                         code 1 InternalError (a sidecar bug, logged)
no-endpoint                            code 133 FailedToSatisfyReadPreference naming what each server is
cancelled                              nothing (the app went away)
=====================================  =========================================================================
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any

from bson.errors import InvalidBSON
from bson.raw_bson import RawBSONDocument

from ...policy import SUCCESS, Outcome, OutcomeClass, Reason, SendAttempt
from ...policy.deadline import timeout_ms
from ...runtime import AttemptContext, AttemptResult, Delivery, drive
from ...services import CompiledPolicy, Services, UpstreamRuntime
from ...telemetry.observer import RequestObserver
from . import replies, wire
from .classify import Failure, classify_failure, classify_reply, labels_of
from .commands import RAW, Command
from .patch import PatchError, set_number
from .pinning import Pins
from .topology import Topology, TopologyPicker
from .upstream import ConnectFailure, Pools

log = logging.getLogger("sidecar.mongo")

#: Codes after which the server is no longer what the topology thinks (not primary, shutting down).
_STATE_CHANGE = frozenset({10107, 13435, 13436, 189, 11602, 10058, 91, 11600})
_CURSOR_REPLIES = frozenset({"find", "aggregate", "getMore", "listCollections", "listIndexes"})


@dataclass(slots=True)
class Answer:
    """An upstream's reply: the endpoint that gave it, the OP_MSG, its body."""

    endpoint: str
    msg: wire.Msg
    body: RawBSONDocument


@dataclass(frozen=True)
class Upstream:
    """What a listener's requests share about its upstream."""

    name: str
    runtime: UpstreamRuntime
    topology: Topology
    pools: Pools
    pins: Pins
    policy: CompiledPolicy
    services: Services
    listener: str
    server_selection_timeout: float

    @property
    def keep_labels(self) -> bool:
        return self.policy.config.final_error_labels == "keep"


class Forward:
    """The attempter for one command (see ``sidecar.runtime.Attempter``)."""

    __slots__ = ("up", "cmd", "msg", "obs")

    def __init__(self, up: Upstream, cmd: Command, msg: wire.Msg, obs: RequestObserver) -> None:
        self.up = up
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
        up, cmd = self.up, self.cmd
        try:
            rid, message, max_time = self._message(sa)
        except PatchError as e:  # bson already read the body whole, so this is not expected
            f = Failure("request", f"cannot set maxTimeMS on this command: {e}")
            return AttemptResult(Outcome(OutcomeClass.FATAL, detail=f.message), f)
        pool = up.pools.get(sa.endpoint)
        try:
            conn = await pool.acquire()
        except ConnectFailure as e:
            f = Failure(e.stage, e.message)
            if e.stage == "connect":  # unreachable: route around it until its monitor sees it again
                up.topology.mark_unknown(sa.endpoint, e.message)
                await self._await_topology(sa)
            return AttemptResult(classify_failure(f, cmd), f)
        try:
            if self.msg.more_to_come:
                await conn.send(message)
                pool.release(conn)
                return AttemptResult(SUCCESS, None)
            header, payload = await conn.roundtrip(message, rid)
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
            up.topology.request_check(sa.endpoint)
            await self._await_topology(sa)
            return AttemptResult(classify_failure(f, cmd), f)
        pool.release(conn)
        outcome = classify_reply(body, cmd, max_time)
        if not outcome.ok:
            code = body.get("code")
            if code is not None:
                self.obs.set_attempt_attribute(sa.attempt, "db.response.status_code", str(code))
            if code in _STATE_CHANGE:
                up.topology.mark_unknown(sa.endpoint, f"answered code {code}")
                await self._await_topology(sa)
        return AttemptResult(outcome, Answer(sa.endpoint, reply, body))

    async def _await_topology(self, sa: SendAttempt) -> None:
        """After a server failed or stepped down, report the result once the topology can route the next
        attempt (a new primary is known), so that a retry does not go back to where it failed."""
        up = self.up
        if up.topology.replica_set is None:
            return
        limit = min(sa.timeout, up.server_selection_timeout)
        await up.topology.wait_selectable(self.cmd.read_preference, limit)

    def discard(self, payload: Any) -> None:
        pass  # replies are read whole and their connections already returned


def _describe(e: BaseException) -> str:
    if isinstance(e, asyncio.IncompleteReadError):
        return "the upstream closed the connection before replying"
    return str(e) or type(e).__name__


async def forward(up: Upstream, msg: wire.Msg, cmd: Command) -> bytes | None:
    """Carry one command; return the reply's body to send the app (``None``: no reply)."""
    loop = asyncio.get_running_loop()
    now = loop.time()
    policy = up.policy
    # maxTimeMS is the app's deadline; without it the policy's default is the sidecar's own bound.
    deadline = now + cmd.max_time_ms / 1000.0 if cmd.max_time_ms is not None else math.inf
    bound = deadline if cmd.max_time_ms is not None else now + policy.engine.deadline
    candidates: list[str] | None = None
    max_attempts: int | None = None
    pinned: str | None = None
    if cmd.in_transaction and cmd.lsid is not None and cmd.txn_number is not None:
        max_attempts = 1  # statements of a transaction are not retried one by one
        pinned = None if cmd.start_transaction else up.pins.transaction(cmd.lsid, cmd.txn_number, now)
    elif cmd.cursor_ids:
        pinned = up.pins.cursor(cmd.cursor_ids, now)
    if pinned is not None:
        candidates = [pinned]
    # Hedging sends copies at once: only for retryable reads (a narrowed request never hedges).
    retry_on = (
        policy.engine.retry_on if policy.engine.hedging is not None and not cmd.retryable_read else None
    )
    rp = cmd.read_preference
    topology = up.topology
    if candidates is None and not topology.eligible(rp):
        await topology.wait_selectable(rp, max(0.0, min(bound - now, up.server_selection_timeout)))
    attrs = {"db.system.name": "mongodb", "db.operation.name": cmd.name, "db.namespace": cmd.db}
    if cmd.collection:
        attrs["db.collection.name"] = cmd.collection
    with up.services.telemetry.request(
        listener=up.listener,
        upstream=up.name,
        protocol="mongodb",
        name=cmd.span_name(),
        attributes=attrs,
    ) as obs:
        if cmd.max_time_ms is not None:
            obs.deadline_received(cmd.max_time_ms / 1000.0)
        call = up.services.new_call(
            policy,
            up.runtime,
            deadline=deadline,
            default_timeout=max(0.0, bound - loop.time()),  # counted from arrival, as the command was whole
            candidates=candidates,
            retry_on=retry_on,
            max_attempts=max_attempts,
            picker=TopologyPicker(up.runtime.balancer, lambda: topology.eligible(rp)),
        )
        delivery = await drive(call, Forward(up, cmd, msg, obs), obs)
        _remember(up, cmd, delivery, now)
        body, error = _answer(up, cmd, msg, delivery)
        obs.end(error)
        return body


def _remember(up: Upstream, cmd: Command, delivery: Delivery, now: float) -> None:
    """Pins: cursors opened and closed, the endpoint of a transaction's first statement."""
    payload = delivery.payload
    if not isinstance(payload, Answer):
        return
    pins = up.pins
    if cmd.in_transaction and cmd.start_transaction and cmd.lsid is not None and cmd.txn_number is not None:
        pins.transaction_started(cmd.lsid, cmd.txn_number, payload.endpoint, now)
    if cmd.name == "killCursors":
        for cid in cmd.cursor_ids:
            pins.cursor_closed(cid)
        return
    if cmd.name in _CURSOR_REPLIES:
        cursor = payload.body.get("cursor")
        if isinstance(cursor, RawBSONDocument):
            cid = cursor.get("id")
            if isinstance(cid, int) and cid:
                pins.cursor_opened(int(cid), payload.endpoint, now)
            elif cmd.name == "getMore":
                for c in cmd.cursor_ids:
                    pins.cursor_closed(c)


def _answer(up: Upstream, cmd: Command, msg: wire.Msg, delivery: Delivery) -> tuple[bytes | None, str | None]:
    """The body to send the app, and the error (for the request span) if it is not a success."""
    f = delivery.finish
    payload = delivery.payload
    if f.reason is Reason.CANCELLED or msg.more_to_come:
        return None, None if f.reason is Reason.SUCCESS else f.reason.value
    if f.reason is Reason.DEADLINE and (
        payload is None or not f.own_deadline and (f.attempt is None or f.attempt != f.attempts)
    ):
        return replies.deadline_doc(cmd), "deadline"
    if f.reason is Reason.INTERNAL:
        return replies.error_doc(1, "InternalError", "retry-sidecar: internal error (logged)"), "internal-error"
    if f.reason is Reason.NO_ENDPOINT:
        return replies.no_server_doc(up.topology.describe_unselectable(cmd.read_preference)), "no-endpoint"
    if payload is None:  # the attempt failed inside the sidecar (logged by the runtime)
        detail = f.outcome.detail if f.outcome is not None else f.reason.value
        return replies.error_doc(1, "InternalError", f"retry-sidecar: {detail}"), detail
    retried_by_sidecar = not cmd.in_transaction
    strip = retried_by_sidecar and not up.keep_labels
    if isinstance(payload, Failure):
        doc = replies.failure_doc(payload, cmd, up.name, f.attempts, keep=not strip)
        return doc, f.outcome.detail if f.outcome is not None else payload.message
    body = payload.msg.body
    if strip and labels_of(payload.body):
        body = replies.without_retry_labels(payload.body) or body
    error = (
        None
        if f.reason is Reason.SUCCESS
        else (f.outcome.detail if f.outcome is not None else f.reason.value)
    )
    return body, error
