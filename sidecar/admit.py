"""One way in, for every protocol: admit a request at its listener's door and begin its engine call.

An adapter's request room says where its requests go once (a :class:`Way`: the listener, its door, the
upstream and the policy) and, per request, what the shared step needs to know: who sent it and when, the
timeout the client sent, whether the operation is exempt, whether it reads or writes, and how its protocol
says "refused". The steps are the same for HTTP, gRPC and MongoDB:

1. **the door** (the listener's ``admission.requests``): an exempt operation or client address goes ahead,
   counted as exempted; any other request goes ahead, waits for a borrowed token (never past its deadline),
   or is refused. A refused request gets its span (the limiter, the reason, when to come back) and its
   protocol's refusal answer (``refused``), and nothing else happens;
2. **the engine call** (``Services.begin_request``): the deadline (the client's, counted from arrival and
   capped by a service config; else the policy's own bound, counted from completion), the request's
   telemetry, the ``Call`` bound to the upstream's balancer and retry budget;
3. **the ticket gate**, when the upstream limits its endpoints' concurrency: each attempt will wait there for
   its endpoint's ticket (``gates/ticket_gate.py``); exempt operations take none.

The callback adapter (HTTP) calls :func:`begin`, which tells its request (an :class:`Admittee`) whether it
was refused or begun, and starts the driver once the wait, if any, is over (on the loop's timer heap). The
coroutine adapters (gRPC, MongoDB) ``await`` :func:`enter`, which waits, then begins, and returns a
:class:`Begun`. At the end, :func:`ticket_refusal` is the one rule for a request whose last attempt got no
ticket.

(The HTTP path allocates nothing here: the per-request facts are keyword arguments, which compiled code
passes as C arguments, and the outcome is told to the request object that exists anyway; see
``sidecar/native.py``.)
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final, Protocol

from mypy_extensions import mypyc_attr

from .admission import Kind
from .admission.refusal import Refusal
from .gates.door import Door, Wait
from .gates.ticket_gate import gate
from .policy import Call, EndpointPicker, Finish, OutcomeClass, Reason
from .runtime import AttemptGate, CallOwner
from .services import CompiledPolicy, Services, UpstreamRuntime
from .telemetry import RequestObserver
from .telemetry.metrics import Meters

INF: Final = math.inf
_WRITE: Final = Kind.WRITE  # enum members as Final aliases (the convention: sidecar/native.py)
_DEADLINE: Final = Reason.DEADLINE


class Way:
    """Where one listener's requests go (to one upstream, under one policy): the fixed part of every entry,
    built once per listener and route, for one generation of the services (a reload builds new ones).
    ``door``: the listener's request gate (``None``: it admits everything)."""

    __slots__ = ("listener", "protocol", "policy", "upstream", "door", "meters")

    def __init__(
        self,
        services: Services,
        listener: str,
        protocol: str,
        policy: CompiledPolicy,
        upstream: UpstreamRuntime,
        meters: Meters | None = None,
    ) -> None:
        self.listener = listener
        self.protocol = protocol
        self.policy = policy
        self.upstream = upstream
        door = services.door(listener)
        self.door: Door | None = door if door is not None and door.requests is not None else None
        self.meters = meters


class Refuser(Protocol):
    """How a protocol answers a request the door refused: write the refusal in its own words (HTTP 429 or
    503 with ``Retry-After``, gRPC ``RESOURCE_EXHAUSTED`` with pushback, MongoDB 462) and record the status
    on ``obs``. The span is ended by the caller. (Compiled, a Protocol is a trait, which interpreted classes
    cannot inherit: implementations do not name it as their base.)"""

    def refused(self, refusal: Refusal, obs: RequestObserver) -> None: ...


@mypyc_attr(allow_interpreted_subclasses=True)
class Admittee(CallOwner):
    """A callback adapter's request on its way in (HTTP's), told what became of it: ``refused`` at the door
    (a :class:`Refuser`), or ``begun``; then, as the owner of its call, when the call ``finished``."""

    def refused(self, refusal: Refusal, obs: RequestObserver) -> None:
        raise NotImplementedError

    def begun(
        self, call: Call, obs: RequestObserver, gate: AttemptGate | None, door: Door | None, wait: Wait | None
    ) -> None:
        """Admitted: its engine call, its telemetry and the gate its attempts take tickets at (``None``: no
        ticket needed). With a ``wait``: queued, its driver starts at ``wait.at`` (then ``door.admitted``),
        unless its client goes first (``door.interrupted``)."""
        raise NotImplementedError


class Begun:
    """A coroutine adapter's request, admitted: its engine call, telemetry, and ticket gate."""

    __slots__ = ("call", "obs", "gate")

    def __init__(self, call: Call, obs: RequestObserver, gate: AttemptGate | None) -> None:
        self.call = call
        self.obs = obs
        self.gate = gate


def begin(
    services: Services,
    way: Way,
    request: Admittee,
    *,
    name: str,
    client: str,
    arrival: float,
    now: float,
    loop: asyncio.AbstractEventLoop,
    received: float | None = None,
    exempt: bool = False,
    kind: Kind = _WRITE,
    attributes: Mapping[str, Any] | None = None,
    parent: Mapping[str, str] | None = None,
    request_complete: bool = True,
    replayable: bool = True,
    retry_on: Collection[OutcomeClass] | None = None,
) -> bool:
    """Admit one request at ``now`` and begin its call; ``request`` is told which (``refused``, answered and
    its span ended: ``False``; or ``begun``: ``True``).

    ``name``, ``attributes``, ``parent``: its span's; ``client``: its IP address (the door's
    ``exempt_cidrs``); ``arrival``: when its first byte came (the client's deadline counts from here);
    ``received``: the timeout the client sent (seconds; ``None``: none); ``exempt``: neither the door nor the
    ticket gate limits it (counted as exempted); ``kind``: the ticket it takes. The rest narrows its call
    (``Services.new_call``)."""
    door = way.door
    wait: Wait | None = None
    if door is not None:
        decision = _decide(door, client, exempt, arrival + received if received is not None else INF, now)
        if isinstance(decision, Refusal):
            _refuse(services, way, request, decision, name, attributes, parent)
            return False
        wait = decision
    call, obs = services.begin_request(
        way.policy,
        way.upstream,
        listener=way.listener,
        protocol=way.protocol,
        name=name,
        arrival=arrival,
        received=received,
        attributes=attributes,
        parent=parent,
        meters=way.meters,
        request_complete=request_complete,
        replayable=replayable,
        retry_on=retry_on,
    )
    tickets = way.upstream.concurrency
    request.begun(call, obs, gate(tickets, kind, loop, exempt) if tickets is not None else None, door, wait)
    return True


async def enter(
    services: Services,
    way: Way,
    refuser: Refuser,
    *,
    name: str,
    client: str,
    arrival: float,
    received: float | None = None,
    cap: float | None = None,
    exempt: bool = False,
    kind: Kind = _WRITE,
    attributes: Mapping[str, Any] | None = None,
    parent: Mapping[str, str] | None = None,
    request_complete: bool = True,
    own_bound: float | None = None,
    candidates: Sequence[str] | None = None,
    retry_on: Collection[OutcomeClass] | None = None,
    max_attempts: int | None = None,
    picker: EndpointPicker | None = None,
) -> Begun | None:
    """:func:`begin` for a coroutine adapter: a request the door queues waits here for its token (cancelled
    while it waits, the client went away: the token goes back), then begins. ``None``: refused (answered by
    ``refuser``, its span ended).

    ``cap``: a timeout applied as if the client had sent it (gRPC's service config). ``own_bound``: for a
    request complete on arrival (MongoDB), the loop time at which the sidecar's own bound ends when the
    client sent no deadline (the policy's default counted from arrival, so a wait at the door counts);
    without it, the bound counts from completion. The other keywords as for :func:`begin`."""
    loop = asyncio.get_running_loop()
    door = way.door
    if door is not None:
        timeout = received if cap is None else min(received if received is not None else INF, cap)
        decision = _decide(
            door, client, exempt, arrival + timeout if timeout is not None else INF, loop.time()
        )
        if isinstance(decision, Refusal):
            _refuse(services, way, refuser, decision, name, attributes, parent)
            return None
        if decision is not None:
            await door.wait(decision)
    call, obs = services.begin_request(
        way.policy,
        way.upstream,
        listener=way.listener,
        protocol=way.protocol,
        name=name,
        arrival=arrival,
        received=received,
        cap=cap,
        default_timeout=None if own_bound is None else max(0.0, own_bound - loop.time()),
        attributes=attributes,
        parent=parent,
        meters=way.meters,
        request_complete=request_complete,
        candidates=candidates,
        retry_on=retry_on,
        max_attempts=max_attempts,
        picker=picker,
    )
    tickets = way.upstream.concurrency
    return Begun(call, obs, gate(tickets, kind, loop, exempt) if tickets is not None else None)


def ticket_refusal(finish: Finish, payload: Any) -> Refusal | None:
    """The request ends on its last attempt's ticket refusal, to be answered as such (HTTP 503, MongoDB
    462, gRPC ``RESOURCE_EXHAUSTED``): ``payload`` is a :class:`Refusal`, unless the client's own deadline
    ended the request, which is answered as a deadline (nobody waits for a refusal any more): ``None``."""
    if isinstance(payload, Refusal) and not (finish.reason is _DEADLINE and not finish.own_deadline):
        return payload
    return None


def _decide(door: Door, client: str, exempt: bool, deadline: float, now: float) -> Refusal | Wait | None:
    if exempt or (door.exemptions and door.client_exempt(client)):
        door.exempt()
        return None
    return door.request(now, deadline)


def _refuse(
    services: Services,
    way: Way,
    refuser: Refuser,
    refusal: Refusal,
    name: str,
    attributes: Mapping[str, Any] | None,
    parent: Mapping[str, str] | None,
) -> None:
    obs = services.telemetry.request(
        listener=way.listener,
        upstream=way.upstream.name,
        protocol=way.protocol,
        name=name,
        attributes=attributes,
        parent=parent,
        meters=way.meters,
    )
    obs.refused(refusal)
    try:
        refuser.refused(refusal, obs)
    finally:
        obs.end(refusal.reason.value)
