"""One proxied call, from the client's metadata to its final status.

Route the method to a policy, read the client's deadline (its ``grpc-timeout``, or the deadline header in
metadata, whichever is sooner; capped by a service config ``timeout``; without either, the policy's default
is the sidecar's own bound), set the call up (``Services.begin_request``), forward the request's messages as
they come (``replay.py``), drive the engine through ``attempt.py``, and once nothing more will be sent to the
client (``Downstream.close``), give it the answer its ``Finish`` maps to (``answer.py``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any

import grpc

from ...admission import Kind
from ...admission.refusal import Refusal
from ...gates.ticket_gate import gate
from ...policy import Reason
from ...policy.deadline import MAX_TIMEOUT_S, parse_timeout_ms
from ...runtime import Driver, drive
from ...services import Services, UpstreamRuntime
from .answer import Answer, Downstream, answer, refused
from .attempt import Attempter
from .classify import GrpcClassifier
from .metadata import first_value, request_metadata
from .replay import RequestStream
from .routing import MethodRoutes
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


async def proxy(shared: Shared, method: str, context: grpc.aio.ServicerContext) -> None:
    loop = asyncio.get_running_loop()
    services = shared.services
    route = shared.routes.resolve(method)
    compiled = services.policy(route.policy)
    pc = compiled.config
    incoming = [(m.key, m.value) for m in context.invocation_metadata() or ()]
    received = _received_timeout(context, incoming, pc.deadline.header)
    arrival = loop.time()
    door = services.door(shared.listener)
    if door is not None and door.requests is not None:
        timeout = received if route.timeout_cap is None else min(received or math.inf, route.timeout_cap)
        refusal = await door.admit(
            peer_host(context.peer()),
            arrival,
            arrival + timeout if timeout is not None else math.inf,
            exempt=method.startswith(HEALTH),
        )
        if refusal is not None:
            obs = services.refused(
                refusal,
                listener=shared.listener,
                upstream=shared.upstream.name,
                protocol="grpc",
                name=route.name,
                attributes={"rpc.system": "grpc", "rpc.service": route.service, "rpc.method": route.method},
                parent={k: v for k, v in incoming if isinstance(v, str)},
            )
            ans = refused(refusal)
            _deliver(context, ans)
            obs.set_attribute("rpc.grpc.status_code", ans.code.value[0])
            obs.end(ans.code.name)
            return
    # A service config's timeout is applied as the client's own deadline, as a direct channel would have.
    call, obs = services.begin_request(
        compiled,
        shared.upstream,
        listener=shared.listener,
        protocol="grpc",
        name=route.name,
        attributes={"rpc.system": "grpc", "rpc.service": route.service, "rpc.method": route.method},
        parent={k: v for k, v in incoming if isinstance(v, str)},
        arrival=arrival,
        received=received,
        cap=route.timeout_cap,
        request_complete=False,  # messages are forwarded as they come: complete once the client half-closed
    )
    stream: RequestStream | None = None
    try:
        limit = pc.replay_buffer if pc.replay_buffer is not None else DEFAULT_REPLAY_BUFFER
        drivers: list[Driver] = []  # the one driver, once drive() made it
        stream = RequestStream(
            context.read,
            limit,
            on_seal=lambda over: over and obs.buffer_exceeded(),
            # the client half-closed and its whole request went upstream: per-try timers, own deadline start
            on_complete=lambda: drivers[0].request_complete(),
            budget=shared.services.buffers,
        )
        down = Downstream(context, stream)
        attempter = Attempter(
            channels=shared.channels,
            method=method,
            request=stream,
            metadata=request_metadata(incoming, pc.deadline.header),
            downstream=down,
            classifier=_classifier(shared, route.policy, pc),
            observer=obs,
            deadline_header=pc.deadline.header if _has(incoming, pc.deadline.header) else None,
            single_request=route.single_request,
        )
        tickets = shared.upstream.concurrency
        gated = None
        if tickets is not None:
            kind = ticket_kind(method, tickets.config.read_methods)
            gated = gate(tickets, kind, loop, exempt=method.startswith(HEALTH))
        delivery = await drive(call, attempter, obs, drivers.append, gated)
        await down.close()  # grpc sends the status when we return: nothing may be in flight beside it
        payload = delivery.payload
        if isinstance(payload, Refusal) and not (
            delivery.finish.reason is Reason.DEADLINE and not delivery.finish.own_deadline
        ):  # the last attempt got no ticket: RESOURCE_EXHAUSTED, and when to come back
            ans = refused(payload, previous=max(0, (delivery.finish.attempt or 1) - 1))
            obs.refused(payload)
        else:
            ans = answer(
                delivery.finish,
                None if isinstance(payload, Refusal) else payload,
                upstream=shared.upstream.name,
                give_up_pushback=pc.give_up_pushback,
            )
        _deliver(context, ans)
        obs.set_attribute("rpc.grpc.status_code", ans.code.value[0])
        obs.end(None if ans.code is grpc.StatusCode.OK else ans.code.name)
    except asyncio.CancelledError:
        obs.end("client cancelled")
        raise
    except BaseException as e:
        obs.end(f"{type(e).__name__}: {e}")
        raise
    finally:
        if stream is not None:
            stream.close()


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


def _deliver(context: grpc.aio.ServicerContext, ans: Answer) -> None:
    try:
        context.set_trailing_metadata(tuple(ans.trailing))
        context.set_code(ans.code)
        if ans.details:
            context.set_details(ans.details)
    except Exception as e:  # noqa: BLE001 - a server call that already ended refuses them
        log.debug("the client is gone before its status: %r", e)


def _received_timeout(
    context: grpc.aio.ServicerContext, incoming: list[tuple[str, Any]], header: str
) -> float | None:
    """The sooner of the client's ``grpc-timeout`` and the deadline header, if either is there."""
    found = []
    remaining = context.time_remaining()
    if remaining is not None and remaining < MAX_TIMEOUT_S:
        found.append(max(0.0, remaining))
    from_header = parse_timeout_ms(first_value(incoming, header))
    if from_header is not None:
        found.append(from_header)
    return min(found) if found else None


def _has(incoming: list[tuple[str, Any]], header: str) -> bool:
    return first_value(incoming, header) is not None


def _classifier(shared: Shared, policy: str, pc: Any) -> GrpcClassifier:
    c = shared.classifiers.get(policy)
    if c is None:
        c = shared.classifiers[policy] = GrpcClassifier.from_names(pc.retryable_codes, pc.overload_codes)
    return c
