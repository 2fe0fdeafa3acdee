"""One proxied call, from the client's metadata to its final status.

Route the method to a policy, read the client's deadline (its ``grpc-timeout``, or the deadline header in
metadata, whichever is sooner; capped by a service config ``timeout``; without either, the policy's default
is the sidecar's own bound), admit and set the call up (``sidecar/admit.py``), forward the request's messages as
they come (``replay.py``), drive the engine through ``attempt.py``, and once nothing more will be sent to the
client (``downstream.py``), give it the answer its ``Finish`` maps to (``answer.py``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import grpc

from ...admission import Kind
from ...admission.refusal import Refusal
from ...admit import Way, enter, ticket_refusal
from ...config import PolicyConfig
from ...policy.deadline import MAX_TIMEOUT_S, parse_timeout_ms
from ...runtime import Delivery, drive
from ...services import Services, UpstreamRuntime
from ...telemetry import RequestObserver
from .answer import Answer, answer, refused
from .attempt import Attempter
from .classify import GrpcClassifier
from .downstream import Downstream
from .metadata import first_value, request_metadata
from .replay import RequestStream
from .routing import MethodRoutes, Route
from .upstream import Channels

log = logging.getLogger("sidecar.grpc")
DEFAULT_REPLAY_BUFFER = 256 * 1024
#: Calls the request gate never limits (counted as exempted): the standard health service.
HEALTH = "/grpc.health.v1.Health/"


@dataclass(slots=True)
class Shared:
    """What every call of a listener uses."""

    listener: str
    services: Services
    upstream: UpstreamRuntime
    routes: MethodRoutes
    channels: Channels
    classifiers: dict[str, GrpcClassifier]
    ways: dict[str, Way]  # by policy name: the listener's way in to its upstream under that policy


async def proxy(shared: Shared, method: str, context: grpc.aio.ServicerContext) -> None:
    services = shared.services
    route = shared.routes.resolve(method)
    compiled = services.policy(route.policy)
    pc = compiled.config
    incoming = [(m.key, m.value) for m in context.invocation_metadata() or ()]
    tickets = shared.upstream.concurrency
    way = _way(shared, route.policy)
    door = way.door
    down = Downstream(context)  # the client's side of the call: what goes to it, refusals included
    header = pc.deadline.header
    from_header = first_value(incoming, header)  # the deadline header's value, if the client sent it
    begun = await enter(
        services,
        way,
        down,
        name=route.name,
        client=peer_host(context.peer()) if door is not None and door.exemptions else "",  # (exempt_cidrs)
        arrival=asyncio.get_running_loop().time(),
        received=_received_timeout(context, from_header),
        cap=route.timeout_cap,  # a service config's timeout, applied as the client's own deadline
        exempt=method.startswith(HEALTH),
        kind=ticket_kind(method, tickets.config.read_methods) if tickets is not None else Kind.WRITE,
        attributes=route.attributes,
        # the caller's trace context, read only when spans are recorded
        parent={k: v for k, v in incoming if isinstance(v, str)}
        if services.telemetry.tracer is not None
        else None,
        request_complete=False,  # messages are forwarded as they come: complete once the client half-closed
    )
    if begun is None:
        return  # refused at the door, and answered
    obs = begun.obs
    stream: RequestStream | None = None
    try:
        stream = _stream(shared, context, pc.replay_buffer, obs)
        attempter = _attempter(
            shared, method, route, pc, incoming, from_header is not None, stream, down, obs
        )
        delivery = await drive(begun.call, attempter, obs, stream.driven_by, begun.gate)
        await down.close()  # grpc sends the status when we return: nothing may be in flight beside it
        down.deliver(_answer(shared, delivery, pc.give_up_pushback, obs), obs)
    except asyncio.CancelledError:
        obs.end("client cancelled")
        raise
    except BaseException as e:
        obs.end(f"{type(e).__name__}: {e}")
        raise
    finally:
        if stream is not None:
            stream.close()


def _stream(
    shared: Shared, context: grpc.aio.ServicerContext, limit: int | None, obs: RequestObserver
) -> RequestStream:
    """The client's messages, forwarded as they come and kept for replay (``replay.py``); the driver hears
    when the whole request went upstream (per-try timers, the sidecar's own deadline start then)."""
    return RequestStream(
        context.read,
        limit if limit is not None else DEFAULT_REPLAY_BUFFER,
        on_overflow=obs.buffer_exceeded,
        budget=shared.services.buffers,
    )


def _attempter(
    shared: Shared,
    method: str,
    route: Route,
    pc: PolicyConfig,
    incoming: list[tuple[str, Any]],
    has_header: bool,
    stream: RequestStream,
    down: Downstream,
    obs: RequestObserver,
) -> Attempter:
    """How the call's attempts go upstream (``attempt.py``): the client's metadata as the upstream gets it,
    its messages from ``stream``, what comes back to ``down``."""
    header = pc.deadline.header
    return Attempter(
        channels=shared.channels,
        method=method,
        request=stream,
        metadata=request_metadata(incoming, header),
        downstream=down,
        classifier=_classifier(shared, route.policy, pc),
        observer=obs,
        deadline_header=header if has_header else None,
        single_request=route.single_request,
    )


def _answer(shared: Shared, delivery: Delivery, give_up_pushback: bool, obs: RequestObserver) -> Answer:
    """The call's one answer: its last attempt's ticket refusal (``RESOURCE_EXHAUSTED``), or what the
    engine's finish maps to (``answer.py``)."""
    finish, payload = delivery.finish, delivery.payload
    refusal = ticket_refusal(finish, payload)
    if refusal is not None:
        obs.refused(refusal)
        return refused(refusal, previous=max(0, (finish.attempt or 1) - 1))
    status = None if isinstance(payload, Refusal) else payload
    return answer(finish, status, upstream=shared.upstream.name, give_up_pushback=give_up_pushback)


def ticket_kind(method: str, read_methods: list[str]) -> Kind:
    """Which ticket an attempt of ``method`` (``/pkg.Service/Method``) takes: a read when
    ``concurrency.read_methods`` names it (exactly, or its service as ``/pkg.Service/*``), else a write."""
    for m in read_methods:
        if m == method or (m.endswith("/*") and method.startswith(m[:-1])):
            return Kind.READ
    return Kind.WRITE


def peer_host(peer: str | None) -> str:
    """The client's IP address from grpc's peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``;
    ``""`` for anything else, a Unix socket)."""
    if not peer:
        return ""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]").replace("%25", "%")
    return ""


def _received_timeout(context: grpc.aio.ServicerContext, header_value: str | None) -> float | None:
    """The sooner of the client's ``grpc-timeout`` and the deadline header (its value, if sent)."""
    remaining = context.time_remaining()
    sent = None if remaining is None or remaining >= MAX_TIMEOUT_S else max(0.0, remaining)
    from_header = parse_timeout_ms(header_value) if header_value is not None else None
    if from_header is None:
        return sent
    return from_header if sent is None else min(sent, from_header)


def _way(shared: Shared, policy: str) -> Way:
    way = shared.ways.get(policy)
    if way is None:
        services = shared.services
        way = shared.ways[policy] = Way(
            services, shared.listener, "grpc", services.policy(policy), shared.upstream
        )
    return way


def _classifier(shared: Shared, policy: str, pc: PolicyConfig) -> GrpcClassifier:
    c = shared.classifiers.get(policy)
    if c is None:
        c = shared.classifiers[policy] = GrpcClassifier.from_names(pc.retryable_codes, pc.overload_codes)
    return c
