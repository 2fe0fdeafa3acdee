"""One command from the app, carried to the upstream under the policy: routing (read preference, cursor and
transaction pins), the engine driven to its finish through ``attempt.py``, the pins it leaves, and the app's
answer (``answer.py``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from bson.raw_bson import RawBSONDocument

from ...admission import Kind
from ...admission.refusal import Refusal
from ...gates.ticket_gate import gate
from ...policy import Reason
from ...runtime import Delivery, drive
from ...services import CompiledPolicy, Services, UpstreamRuntime
from . import wire
from .answer import for_finish, refusal_doc
from .attempt import Attempt, Reply
from .commands import Command
from .pinning import Pins
from .topology import Topology, TopologyPicker
from .upstream import Pools

_CURSOR_REPLIES = frozenset({"find", "aggregate", "getMore", "listCollections", "listIndexes"})
#: Commands that never wait for a ticket (the seed's kExempt: they keep the system observable or release
#: resources); counted as exempted. ``hello``/``isMaster`` are answered by the sidecar itself.
EXEMPT = frozenset(
    {
        "hello",
        "isMaster",
        "ismaster",
        "ping",
        "buildInfo",
        "buildinfo",
        "killCursors",
        "endSessions",
        "commitTransaction",
        "abortTransaction",
    }
)


@dataclass(frozen=True)
class Shared:
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


async def forward(up: Shared, msg: wire.Msg, cmd: Command, arrival: float | None = None) -> bytes | None:
    """Carry one command; return the reply's body to send the app (``None``: no reply). ``arrival``: when
    it came (loop time), if it waited since (admission): its maxTimeMS counts from then."""
    loop = asyncio.get_running_loop()
    now = loop.time() if arrival is None else arrival
    policy = up.policy
    # maxTimeMS is the app's deadline; without it the policy's default is the sidecar's own bound.
    timeout = cmd.max_time_ms / 1000.0 if cmd.max_time_ms is not None else policy.engine.deadline
    bound = now + timeout  # the app's deadline, or the policy's own for a command without maxTimeMS
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
    call, obs = up.services.begin_request(
        policy,
        up.runtime,
        listener=up.listener,
        protocol="mongodb",
        name=cmd.span_name(),
        attributes=attrs,
        arrival=now,
        received=cmd.max_time_ms / 1000.0 if cmd.max_time_ms is not None else None,
        default_timeout=max(0.0, bound - loop.time()),  # counted from arrival: the command came whole
        candidates=candidates,
        retry_on=retry_on,
        max_attempts=max_attempts,
        picker=TopologyPicker(
            up.runtime.balancer,
            lambda: topology.eligible(rp),
            up.server_selection_timeout if topology.replica_set is not None else 0.0,
        ),
    )
    tickets = up.runtime.concurrency
    gated = None
    if tickets is not None:
        gated = gate(tickets, Kind.READ if cmd.reads_only else Kind.WRITE, loop, exempt=cmd.name in EXEMPT)
    with obs:
        delivery = await drive(
            call, Attempt(up.pools, topology, cmd, msg, obs), obs, gate=gated
        )
        payload = delivery.payload
        if isinstance(payload, Refusal):
            finish = delivery.finish
            if not msg.more_to_come and not (finish.reason is Reason.DEADLINE and not finish.own_deadline):
                obs.refused(payload)  # the last attempt got no ticket: code 462, overloaded and retryable
                obs.end(payload.message)
                return refusal_doc(payload)
            delivery = Delivery(finish, None)  # the app's deadline ended it (or it wants no reply)
        _remember(up, cmd, delivery, now)
        body, error = for_finish(topology, up.name, up.keep_labels, cmd, msg, delivery)
        obs.end(error)
        return body


def _remember(up: Shared, cmd: Command, delivery: Delivery, now: float) -> None:
    """Pins: cursors opened and closed, the endpoint of a transaction's first statement."""
    payload = delivery.payload
    if not isinstance(payload, Reply):
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
