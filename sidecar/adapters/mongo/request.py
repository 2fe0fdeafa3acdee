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
from ...admit import Begun, Way, enter, ticket_refusal
from ...runtime import Delivery, drive
from ...services import CompiledPolicy, Services, UpstreamRuntime
from ...telemetry import RequestObserver
from . import wire
from .answer import for_finish, refusal_doc
from .attempt import Attempt, Reply
from .commands import Command
from .pinning import Pins
from .topology import Topology, TopologyPicker
from .upstream import Pools

_CURSOR_REPLIES = frozenset({"find", "aggregate", "getMore", "listCollections", "listIndexes"})
#: Commands neither the door nor the ticket gate limits (the seed's kExempt: they keep the system observable
#: or release resources); counted as exempted. (``hello`` and ``endSessions`` never come here: the sidecar
#: answers them itself, and its listener counts them as exempted.)
EXEMPT = frozenset({"ping", "buildInfo", "buildinfo", "killCursors", "commitTransaction", "abortTransaction"})


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
    way: Way  # the listener's way in (``admit.py``)

    @property
    def keep_labels(self) -> bool:
        return self.policy.config.final_error_labels == "keep"


async def forward(up: Shared, msg: wire.Msg, cmd: Command, client: str) -> bytes | None:
    """Carry one command from ``client`` (its IP address); return the reply's body to send the app
    (``None``: no reply)."""
    arrival = asyncio.get_running_loop().time()
    refuser = _Refuser()
    begun = await _enter(up, cmd, client, arrival, refuser)
    if begun is None:
        return refuser.body  # refused at the door: code 462, overloaded and retryable
    obs = begun.obs
    with obs:
        delivery = await drive(
            begun.call, Attempt(up.pools, up.topology, cmd, msg, obs), obs, gate=begun.gate
        )
        refusal = ticket_refusal(delivery.finish, delivery.payload)
        if refusal is not None and not msg.more_to_come:
            obs.refused(refusal)  # the last attempt got no ticket: code 462, overloaded and retryable
            obs.end(refusal.message)
            return refusal_doc(refusal)
        if isinstance(delivery.payload, Refusal):  # the app's deadline ended it (or it wants no reply)
            delivery = Delivery(delivery.finish, None)
        _remember(up, cmd, delivery, arrival)
        body, error = for_finish(up.topology, up.name, up.keep_labels, cmd, msg, delivery)
        obs.end(error)
        return body


async def _enter(up: Shared, cmd: Command, client: str, arrival: float, refuser: _Refuser) -> Begun | None:
    """The command's way in: its deadline (``maxTimeMS``; without it the policy's default is the sidecar's
    own bound, counted from arrival: the command came whole), its pins (a cursor's or a transaction's
    endpoint), hedging only for retryable reads, servers that fit its read preference."""
    policy = up.policy
    candidates: list[str] | None = None
    max_attempts: int | None = None
    pinned: str | None = None
    if cmd.in_transaction and cmd.lsid is not None and cmd.txn_number is not None:
        max_attempts = 1  # statements of a transaction are not retried one by one
        pinned = None if cmd.start_transaction else up.pins.transaction(cmd.lsid, cmd.txn_number, arrival)
    elif cmd.cursor_ids:
        pinned = up.pins.cursor(cmd.cursor_ids, arrival)
    if pinned is not None:
        candidates = [pinned]
    attrs = {"db.system.name": "mongodb", "db.operation.name": cmd.name, "db.namespace": cmd.db}
    if cmd.collection:
        attrs["db.collection.name"] = cmd.collection
    rp, topology = cmd.read_preference, up.topology
    return await enter(
        up.services,
        up.way,
        refuser,
        name=cmd.span_name(),
        client=client,
        arrival=arrival,
        received=cmd.max_time_ms / 1000.0 if cmd.max_time_ms is not None else None,
        exempt=cmd.name in EXEMPT,
        kind=Kind.READ if cmd.reads_only else Kind.WRITE,
        attributes=attrs,
        own_bound=arrival + policy.engine.deadline,
        candidates=candidates,
        # Hedging sends copies at once: only for retryable reads (a narrowed request never hedges).
        retry_on=policy.engine.retry_on
        if policy.engine.hedging is not None and not cmd.retryable_read
        else None,
        max_attempts=max_attempts,
        picker=TopologyPicker(
            up.runtime.balancer,
            lambda: topology.eligible(rp),
            up.server_selection_timeout,
            retries_wait=topology.replica_set is not None,
            check=topology.request_check,
        ),
    )


class _Refuser:
    """A command the door refused (an ``admit.Refuser``): the error document to reply with (code 462)."""

    __slots__ = ("body",)

    def __init__(self) -> None:
        self.body: bytes | None = None

    def refused(self, refusal: Refusal, obs: RequestObserver) -> None:
        self.body = refusal_doc(refusal)


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
