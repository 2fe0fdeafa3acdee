"""The gRPC listener's ``idle_timeout``: a connection without calls gets GOAWAY and is closed."""

from __future__ import annotations

import asyncio

from sidecar.app import App
from sidecar.config import load_dict
from sidecar.testing.grpc_upstream import GrpcUpstream
from sidecar.testing.h2frames import GOAWAY, PREFACE, SETTINGS, frame

from .conftest import config


def frame_kinds(data: bytes) -> list[int]:
    kinds, i = [], 0
    while i + 9 <= len(data):
        length = int.from_bytes(data[i : i + 3], "big")
        kinds.append(data[i + 3])
        i += 9 + length
    return kinds


async def test_an_idle_connection_gets_goaway(up: GrpcUpstream) -> None:
    async with App(load_dict(config([up.endpoint], idle_timeout="300ms"), {})) as app:
        host, port = app.address("g")
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(PREFACE + frame(SETTINGS, 0, 0, b""))
            got = bytearray()
            async with asyncio.timeout(20):  # grpc core checks idleness coarsely: a generous bound
                while GOAWAY not in frame_kinds(bytes(got)):
                    chunk = await reader.read(65536)
                    assert chunk, f"closed without GOAWAY: {frame_kinds(bytes(got))}"
                    got += chunk
        finally:
            writer.close()
