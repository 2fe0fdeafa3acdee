"""The gRPC listener's ``max_connections``: grpc core's ``grpc.max_allowed_incoming_connections`` closes a
connection over the cap at once (grpcio cannot leave it in the backlog); the connections held keep working."""

from __future__ import annotations

import asyncio

import grpc

from sidecar.app import App
from sidecar.config import load_dict
from sidecar.testing.grpc_upstream import GrpcUpstream
from sidecar.testing.h2frames import PREFACE, SETTINGS, frame

from .conftest import config


async def test_a_connection_over_the_cap_is_closed(up: GrpcUpstream) -> None:
    async with App(load_dict(config([up.endpoint], max_connections=1), {})) as app:
        host, port = app.address("g")
        async with grpc.aio.insecure_channel(f"{host}:{port}") as ch:
            assert await ch.unary_unary("/pkg.Svc/Get")(b"a", timeout=10) == b"a"
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(PREFACE + frame(SETTINGS, 0, 0, b""))
                async with asyncio.timeout(10):
                    while await reader.read(65536):
                        pass  # until the server closes it
            except ConnectionResetError:
                pass
            finally:
                writer.close()
            assert await ch.unary_unary("/pkg.Svc/Get")(b"b", timeout=10) == b"b"
