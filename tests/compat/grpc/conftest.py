"""The gRPC differential suite: the same call made directly and through the sidecar must end the same way.

One upstream server, made of real third-party services (grpcio's health and reflection servicers) and a
route_guide-style service with all four call shapes (generic handlers on raw bytes: no generated code),
behind the sidecar (an in-process App). Each test makes its call on the direct channel and on the sidecar's,
and compares status code, details, response messages, initial and trailing metadata.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sidecar.app import App
from sidecar.config import load_dict

from .route_guide import SERVICE, RouteGuide

#: Keys the sidecar sets on purpose in what the client gets back (docs/grpc.md, "What the sidecar changes").
SIDECAR_KEYS = frozenset({"grpc-previous-rpc-attempts"})


@dataclass
class Result:
    """How one call ended, as its client saw it."""

    code: grpc.StatusCode
    details: str
    messages: list[bytes]
    initial: list[tuple[str, Any]] = field(default_factory=list)
    trailing: list[tuple[str, Any]] = field(default_factory=list)


def _md(md: Any) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in (md or ()) if k not in SIDECAR_KEYS]


async def result(call: Any, messages: list[bytes]) -> Result:
    return Result(
        await call.code(),
        await call.details() or "",
        messages,
        _md(await call.initial_metadata()),
        _md(await call.trailing_metadata()),
    )


async def unary(ch: grpc.aio.Channel, method: str, request: bytes, **kw: Any) -> Result:
    call = ch.unary_unary(method)(request, **kw)
    try:
        return await result(call, [await call])
    except grpc.aio.AioRpcError:
        return await result(call, [])


async def server_stream(ch: grpc.aio.Channel, method: str, request: bytes, **kw: Any) -> Result:
    call = ch.unary_stream(method)(request, **kw)
    got: list[bytes] = []
    try:
        async for m in call:
            got.append(m)
    except grpc.aio.AioRpcError:
        pass
    return await result(call, got)


async def client_stream(ch: grpc.aio.Channel, method: str, requests: list[bytes], **kw: Any) -> Result:
    call = ch.stream_unary(method)(**kw)
    try:
        for r in requests:
            await call.write(r)
        await call.done_writing()
        return await result(call, [await call])
    except grpc.aio.AioRpcError:
        return await result(call, [])


class Upstream:
    """The server both channels reach: health, reflection and the route guide."""

    def __init__(self) -> None:
        self.health = health.aio.HealthServicer()
        self.guide = RouteGuide()
        self.server = grpc.aio.server(options=(("grpc.so_reuseport", 0),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (health.SERVICE_NAME, reflection.SERVICE_NAME, SERVICE)
        reflection.enable_server_reflection(names, self.server)
        self.server.add_generic_rpc_handlers((self.guide,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")


@dataclass
class Pair:
    upstream: Upstream
    direct: grpc.aio.Channel
    via: grpc.aio.Channel
    direct_target: str
    via_target: str
    app: App

    async def both(self, call: Callable[[grpc.aio.Channel], Awaitable[Result]]) -> tuple[Result, Result]:
        """The same call, directly and through the sidecar (one after the other: the upstream's state is
        shared)."""
        return await call(self.direct), await call(self.via)

    async def same(self, call: Callable[[grpc.aio.Channel], Awaitable[Result]]) -> Result:
        direct, via = await self.both(call)
        assert via == direct
        return via


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    up = Upstream()
    await up.server.start()
    cfg = {
        "admin": {"listen": None},
        "upstreams": {"u": {"endpoints": [f"127.0.0.1:{up.port}"]}},
        "listeners": [{"name": "g", "protocol": "grpc", "listen": "127.0.0.1:0", "upstream": "u"}],
    }
    try:
        async with App(load_dict(cfg, {})) as app:
            host, port = app.address("g")
            direct_target, via_target = f"127.0.0.1:{up.port}", f"{host}:{port}"
            options = (("grpc.enable_retries", 0),)
            async with (
                grpc.aio.insecure_channel(direct_target, options=options) as direct,
                grpc.aio.insecure_channel(via_target, options=options) as via,
            ):
                yield Pair(up, direct, via, direct_target, via_target, app)
    finally:
        await up.server.stop(0)
