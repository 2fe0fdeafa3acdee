"""WebSocket through the HTTP listener (issue 22): a real server (the ``websockets`` library) and real clients
(aiohttp's and ``websockets``'): the handshake an attempt under the policy (retried when the first endpoint is
down; any other answer delivered as is), then a tunnel: text, binary, a 4 MiB message, ping/pong and close
codes pass through; a silent tunnel is closed after ``tunnel_idle_timeout``; a drain lets an open tunnel carry
messages for its grace, then ends it."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import websockets
from websockets.asyncio.server import ServerConnection
from websockets.http11 import Response

from sidecar.app import App
from sidecar.config import load_dict
from tests.metrics import metric, until

from .conftest import FAST, unused_port


async def echo(ws: ServerConnection) -> None:
    async for message in ws:
        if message == "close 4001":
            await ws.close(4001, "asked to")
            return
        if message == "drop":  # the server's side goes, without a closing handshake
            ws.transport.abort()
            return
        await ws.send(message)


def refuse_some(connection: ServerConnection, request: Any) -> Response | None:
    if request.path == "/forbidden":
        return connection.respond(403, "no websocket for you\n")
    return None


@asynccontextmanager
async def ws_server() -> AsyncIterator[int]:
    async with websockets.serve(echo, "127.0.0.1", 0, max_size=None, process_request=refuse_some) as server:
        yield server.sockets[0].getsockname()[1]


@asynccontextmanager
async def through(endpoints: list[str], **listener: Any) -> AsyncIterator[tuple[App, str]]:
    cfg = {
        "admin": {"listen": None},
        "upstreams": {"ws": {"endpoints": endpoints}},
        "policies": {"p": {"extends": "http-default", **FAST}},
        "listeners": [
            {
                "name": "l",
                "protocol": "http",
                "listen": "127.0.0.1:0",
                "upstream": "ws",
                "policy": "p",
                **listener,
            }
        ],
    }
    async with App(load_dict(cfg, {})) as app:
        host, port = app.address("l")
        yield app, f"ws://{host}:{port}"


def tunnels(app: App, end: str | None = None) -> float:
    if end is None:
        return metric(app, "sidecar_http_tunnels", listener="l")
    return metric(app, "sidecar_http_tunnels_total", listener="l", upstream="ws", end=end)


async def test_text_binary_a_4mib_message_and_close_codes_pass_through_with_aiohttp() -> None:
    async with ws_server() as port, through([f"127.0.0.1:{port}"]) as (app, url):
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(url + "/chat", max_msg_size=8 << 20) as ws,
        ):
            await ws.send_str("hello")
            assert (await ws.receive()).data == "hello"
            await ws.send_bytes(bytes(range(256)))
            assert (await ws.receive()).data == bytes(range(256))
            big = bytes(range(256)) * (4 << 20 >> 8)
            await ws.send_bytes(big)
            got = await ws.receive()
            assert got.type is aiohttp.WSMsgType.BINARY and got.data == big
            assert tunnels(app) == 1
            await ws.send_str("close 4001")  # the server closes with its own code
            closing = await ws.receive()
            assert (
                closing.type is aiohttp.WSMsgType.CLOSE
                and closing.data == 4001
                and closing.extra == "asked to"
            )
        await until(lambda: tunnels(app) == 0, "the tunnel ended")
        # which side's TCP closed first after a closing handshake is the two ends' race
        assert tunnels(app, "client") + tunnels(app, "upstream") == 1


async def test_the_side_that_goes_first_is_counted() -> None:
    async with ws_server() as port, through([f"127.0.0.1:{port}"]) as (app, url):
        async with websockets.connect(url + "/x") as ws:
            await ws.send("drop")  # the upstream resets its side
            with pytest.raises(websockets.ConnectionClosedError):
                await asyncio.wait_for(ws.recv(), 30)
        await until(lambda: tunnels(app, "upstream") == 1, "the tunnel ended by the upstream")
        async with websockets.connect(url + "/x") as ws:
            await ws.send("one")
            assert await ws.recv() == "one"
            ws.transport.abort()  # the app's side resets its side
        await until(lambda: tunnels(app, "client") == 1, "the tunnel ended by the client")
        assert tunnels(app) == 0


async def test_ping_pong_and_the_client_s_close_code_with_websockets() -> None:
    codes: list[int | None] = []

    async def record(ws: ServerConnection) -> None:
        try:
            async for message in ws:
                await ws.send(message)
        finally:
            codes.append(ws.close_code)

    async with websockets.serve(record, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with through([f"127.0.0.1:{port}"]) as (app, url):
            async with websockets.connect(url + "/x") as ws:
                await ws.send("hi")
                assert await ws.recv() == "hi"
                latency = await ws.ping()
                await latency  # the server's pong came back through the tunnel
                await ws.close(4002, "done")
            await until(lambda: codes == [4002], "the server saw the client's close code")
            await until(lambda: tunnels(app) == 0, "the tunnel ended")


async def test_the_handshake_is_retried_when_the_first_endpoint_is_down() -> None:
    async with (
        ws_server() as port,
        through([f"127.0.0.1:{unused_port()}", f"127.0.0.1:{port}"]) as (app, url),
    ):
        for _ in range(4):
            async with websockets.connect(url + "/x") as ws:
                await ws.send("again")
                assert await ws.recv() == "again"
        assert (
            metric(app, "sidecar_attempts_total", listener="l", upstream="ws", outcome="connect-failure") >= 1
        )


async def test_a_handshake_answered_403_is_delivered_as_is() -> None:
    async with ws_server() as port, through([f"127.0.0.1:{port}"]) as (app, url):
        with pytest.raises(websockets.InvalidStatus) as e:
            async with websockets.connect(url + "/forbidden"):
                pass
        assert e.value.response.status_code == 403 and e.value.response.body == b"no websocket for you\n"
        assert tunnels(app) == 0


async def test_an_upgrade_the_listener_does_not_allow_goes_as_a_plain_request() -> None:
    async with ws_server() as port, through([f"127.0.0.1:{port}"], upgrades=[]) as (_, url):
        with pytest.raises(websockets.InvalidStatus) as e:  # the server gets no Upgrade: 426 from websockets
            async with websockets.connect(url + "/x"):
                pass
        assert e.value.response.status_code == 426


async def test_a_silent_tunnel_is_closed_after_tunnel_idle_timeout() -> None:
    async with (
        ws_server() as port,
        through([f"127.0.0.1:{port}"], tunnel_idle_timeout="300ms", header_timeout="200ms") as (app, url),
        websockets.connect(url + "/x") as ws,
    ):
        await ws.send("one")
        assert await ws.recv() == "one"
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 30)  # nothing more: the sidecar closes the tunnel
        assert tunnels(app, "idle") == 1 and tunnels(app) == 0


async def test_a_drain_lets_an_open_tunnel_carry_messages_for_its_grace_then_ends_it() -> None:
    """SIGTERM's drain (``App.stop(grace)``, what ``sidecar run`` does on SIGTERM)."""
    async with ws_server() as port, through([f"127.0.0.1:{port}"]) as (app, url):
        async with websockets.connect(url + "/x") as ws:
            stopping = asyncio.create_task(app.stop(grace=2.0))
            await until(lambda: not app.ready, "the drain began")
            for i in range(3):  # the drain has begun: the tunnel still carries messages
                await ws.send(f"during {i}")
                assert await ws.recv() == f"during {i}"
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 30)  # closed at the end of the grace
            await stopping
        assert tunnels(app, "drain") == 1


async def test_sigterm_with_an_open_tunnel(tmp_path: Path) -> None:
    """``sidecar run`` as a user runs it: on SIGTERM the open tunnel still carries messages during the
    drain's grace, and is closed at its end; the process exits."""
    from tests.integration.test_reload import sidecar_process, wait_for_line

    async with ws_server() as port:
        listen = unused_port()
        config = tmp_path / "sidecar.yaml"
        config.write_text(
            'admin: {listen: "127.0.0.1:0"}\n'
            "shutdown: {grace: 2s}\n"
            f'upstreams: {{ws: {{endpoints: ["127.0.0.1:{port}"]}}}}\n'
            f'listeners: [{{name: l, protocol: http, listen: "127.0.0.1:{listen}", upstream: ws}}]\n'
        )
        async with sidecar_process(config) as (proc, lines):
            async with websockets.connect(f"ws://127.0.0.1:{listen}/x") as ws:
                await ws.send("before")
                assert await ws.recv() == "before"
                proc.send_signal(signal.SIGTERM)
                await wait_for_line(lines, "draining")
                for i in range(3):
                    await ws.send(f"during {i}")
                    assert await ws.recv() == f"during {i}"
                with pytest.raises(websockets.ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 30)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
