"""One malformed HTTP/2 HEADERS frame (a ``:path`` that is not UTF-8) kills grpc.aio's server loop
(grpcio 1.85.1, docs/grpc.md): the listener notices at once, reports not-ready, logs the cause once, and
listens again on the same address; a call in progress goes on to its end."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import grpc
import pytest

from sidecar.app import App
from sidecar.config import load_dict
from sidecar.testing.grpc_upstream import GrpcUpstream, Step
from sidecar.testing.h2frames import grpc_call, send_raw

from .conftest import config

BAD_PATH = b"/pkg.Svc/\xb2Get"


class ReadinessAtLog(logging.Handler):
    """Records the app's readiness at the moment the listener logs the death of grpcio's loop."""

    def __init__(self, app: App) -> None:
        super().__init__(logging.ERROR)
        self.app = app
        self.ready_then: list[bool] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "server loop died" in record.getMessage():
            self.ready_then.append(self.app.is_ready())


async def readyz(http: aiohttp.ClientSession, app: App) -> int:
    assert app.admin is not None
    host, port = app.admin.address
    async with http.get(f"http://{host}:{port}/readyz") as r:
        return r.status


async def test_bad_path_does_not_kill_the_listener(
    up: GrpcUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cfg = {**config([up.endpoint]), "admin": {"listen": "127.0.0.2:0"}}
    async with App(load_dict(cfg, {})) as app, aiohttp.ClientSession() as http:
        watch = ReadinessAtLog(app)
        logging.getLogger("sidecar.grpc").addHandler(watch)
        try:
            host, port = app.address("g")
            assert await readyz(http, app) == 200
            up.then(Step(echo_each=True))
            async with grpc.aio.insecure_channel(f"{host}:{port}") as ch:
                call = ch.stream_stream("/pkg.Svc/Chat")()
                await call.write(b"one")
                assert await call.read() == b"one"

                await send_raw(host, port, grpc_call(BAD_PATH), read_for=0.5)

                async with asyncio.timeout(10):  # generous on a loaded machine; the rebuild takes ms
                    while watch.ready_then == [] or not app.is_ready():
                        await asyncio.sleep(0.01)
                assert watch.ready_then == [False]  # not ready while it was being rebuilt
                assert await readyz(http, app) == 200
                assert app.address("g") == (host, port)

                # the call that was in progress when the loop died goes on
                await call.write(b"two")
                assert await call.read() == b"two"
                await call.done_writing()
                assert await call.code() == grpc.StatusCode.OK

            # a new connection, to the same address, is served
            async with grpc.aio.insecure_channel(f"{host}:{port}") as ch:
                assert await ch.unary_unary("/pkg.Svc/Get")(b"hi", timeout=10) == b"hi"
        finally:
            logging.getLogger("sidecar.grpc").removeHandler(watch)

    mentions = [r for r in caplog.records if "UnicodeDecodeError" in r.getMessage() or r.exc_info]
    assert len(mentions) == 1, [r.getMessage() for r in mentions]
    assert mentions[0].name == "sidecar.grpc" and "0xb2" in mentions[0].getMessage()


async def test_again_and_again(up: GrpcUpstream) -> None:
    """Each death is survived, not only the first."""
    async with App(load_dict(config([up.endpoint]), {})) as app:
        host, port = app.address("g")
        async with grpc.aio.insecure_channel(f"{host}:{port}") as ch:
            for _ in range(3):
                await send_raw(host, port, grpc_call(BAD_PATH), read_for=0.2)
                assert await ch.unary_unary("/pkg.Svc/Get")(b"x", timeout=10, wait_for_ready=True) == b"x"
