"""grpcio's own health and reflection services, directly and through the sidecar."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from .conftest import Pair, Result, unary

S = grpc.StatusCode
CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"


def request(service: str) -> bytes:
    return health_pb2.HealthCheckRequest(service=service).SerializeToString()


def status(message: bytes) -> int:
    return health_pb2.HealthCheckResponse.FromString(message).status


async def test_check_serving_and_unknown_service(pair: Pair) -> None:
    await pair.upstream.health.set("routeguide.RouteGuide", health_pb2.HealthCheckResponse.SERVING)
    r = await pair.same(lambda ch: unary(ch, CHECK, request("routeguide.RouteGuide")))
    assert [status(m) for m in r.messages] == [health_pb2.HealthCheckResponse.SERVING]
    r = await pair.same(lambda ch: unary(ch, CHECK, request("no.Such")))
    assert r.code is S.NOT_FOUND


async def test_watch_follows_status_changes(pair: Pair) -> None:
    h = pair.upstream.health
    R = health_pb2.HealthCheckResponse

    async def watch(ch: grpc.aio.Channel) -> Result:
        await h.set("svc", R.SERVING)
        call = ch.unary_stream(WATCH)(request("svc"), timeout=30)
        got = [await call.read()]  # the current status, at once
        await h.set("svc", R.NOT_SERVING)
        got.append(await call.read())
        await h.set("svc", R.SERVING)
        got.append(await call.read())
        call.cancel()
        return Result(await call.code(), "", got)

    r = await pair.same(watch)
    assert [status(m) for m in r.messages] == [R.SERVING, R.NOT_SERVING, R.SERVING]


async def test_reflection_lists_services_and_finds_the_file_of_a_symbol(pair: Pair) -> None:
    def reflect(target: str) -> tuple[list[str], str, list[str]]:
        with grpc.insecure_channel(target) as ch:
            db = ProtoReflectionDescriptorDatabase(ch)
            services = sorted(db.get_services())
            f = db.FindFileContainingSymbol("grpc.health.v1.Health")
            return services, f.name, [s.name for s in f.service]

    direct = await asyncio.to_thread(reflect, pair.direct_target)
    assert await asyncio.to_thread(reflect, pair.via_target) == direct
    assert "grpc.health.v1.Health" in direct[0] and direct[2] == ["Health"]
