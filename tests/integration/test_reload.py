"""Live configuration reload through real processes and clients: SIGHUP and a change of the config file
(a ConfigMap's symlink swap) replace endpoints and policies for new requests while a request in flight
finishes under the config it began with; an invalid config or one that needs a restart is refused, counted,
and the old config keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from aiohttp import web
from pymongo import AsyncMongoClient

from sidecar.app import App
from sidecar.config import load_file
from sidecar.reload import ConfigWatcher
from sidecar.testing.grpc_upstream import GrpcUpstream
from sidecar.testing.http_upstream import FaultyUpstream
from sidecar.testing.mongo import MongoTestServer


class GatedUpstream:
    """An HTTP upstream that answers with its name; while ``gate`` is clear, requests wait for it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gate = asyncio.Event()
        self.gate.set()
        self.arrived = asyncio.Event()
        self.hits = 0
        self._runner: web.AppRunner | None = None
        self.endpoint = ""

    async def _handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        self.arrived.set()
        await self.gate.wait()
        return web.Response(text=self.name)

    async def __aenter__(self) -> GatedUpstream:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.endpoint = f"127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.gate.set()
        assert self._runner is not None
        await self._runner.cleanup()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_text(
    endpoint: str, *, port: int, admin: int = 0, attempts: int = 1, listen: str | None = None
) -> str:
    return f"""
admin: {{listen: "127.0.0.1:{admin}"}}
policies:
  p: {{extends: http-default, max_attempts: {attempts}, backoff: {{initial: 1ms, max: 1ms}}}}
upstreams:
  orders: {{endpoints: ["{endpoint}"]}}
listeners:
  - {{name: orders, protocol: http, listen: "{listen or f"127.0.0.1:{port}"}", upstream: orders, policy: p}}
"""


async def metric(http: aiohttp.ClientSession, admin: str, result: str) -> float:
    async with http.get(f"{admin}/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith(f'sidecar_config_reloads_total{{result="{result}"}}'):
            return float(line.split()[-1])
    return 0.0


@contextlib.asynccontextmanager
async def sidecar_process(
    config: Path,
) -> AsyncIterator[tuple[asyncio.subprocess.Process, asyncio.Queue[str]]]:
    """``sidecar run`` as a user runs it; its log lines arrive in the queue."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar",
        "run",
        "-c",
        str(config),
        "--watch-interval",
        "0",
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: asyncio.Queue[str] = asyncio.Queue()

    async def pump() -> None:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            await lines.put(raw.decode(errors="replace"))

    reader = asyncio.create_task(pump())
    try:
        await wait_for_line(lines, "admin on http://")
        yield proc, lines
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
        await reader


async def wait_for_line(lines: asyncio.Queue[str], text: str) -> str:
    seen = []
    async with asyncio.timeout(30):
        while True:
            line = await lines.get()
            seen.append(line)
            if text in line:
                return line
            assert "Traceback" not in line, "".join(seen)


async def test_sighup_moves_new_requests_to_the_new_endpoint_while_one_in_flight_finishes_on_the_old(
    tmp_path: Path,
) -> None:
    port, admin_port = free_port(), free_port()
    cfg = tmp_path / "config.yaml"
    async with GatedUpstream("old") as old, GatedUpstream("new") as new, aiohttp.ClientSession() as http:
        cfg.write_text(config_text(old.endpoint, port=port, admin=admin_port))
        async with sidecar_process(cfg) as (proc, lines):
            url, admin = f"http://127.0.0.1:{port}/orders", f"http://127.0.0.1:{admin_port}"
            old.gate.clear()
            in_flight = asyncio.create_task(http.get(url))
            await old.arrived.wait()

            cfg.write_text(config_text(new.endpoint, port=port, admin=admin_port))
            proc.send_signal(signal.SIGHUP)
            await wait_for_line(lines, "config reloaded")

            async with http.get(url) as r:
                assert (r.status, await r.text()) == (200, "new")
            assert not in_flight.done()  # still waiting on the old endpoint, through the reload
            old.gate.set()
            async with await in_flight as r:
                assert (r.status, await r.text()) == (200, "old")
            assert (old.hits, new.hits) == (1, 1)
            async with http.get(f"{admin}/config") as r:
                assert (await r.json())["upstreams"]["orders"]["endpoints"] == [new.endpoint]
            assert await metric(http, admin, "applied") == 1
            assert proc.returncode is None


async def test_a_policy_change_applies_to_the_next_request_on_the_same_client_connection(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "config.yaml"
    async with FaultyUpstream() as up:
        port = free_port()
        cfg.write_text(config_text(up.endpoint, port=port, attempts=1))
        async with App(load_file(cfg), config_path=cfg) as app:
            # One raw keep-alive connection for both requests: the reload must not close it.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)

            async def get() -> int:
                writer.write(b"GET / HTTP/1.1\r\nHost: orders\r\n\r\n")
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                assert length is not None, head
                await reader.readexactly(int(length[1]))
                return int(head.split()[1])

            try:
                up.fail_next(1)
                assert await get() == 503  # one attempt: the 503 is the answer
                cfg.write_text(config_text(up.endpoint, port=port, attempts=2))
                assert await app.reload()
                up.fail_next(1)
                assert await get() == 200  # two attempts: the retry succeeds
                assert up.hits == 3
            finally:
                writer.close()


async def test_a_configmap_symlink_swap_is_picked_up(tmp_path: Path) -> None:
    """Kubernetes mounts ``config.yaml -> ..data/config.yaml`` and updates by pointing ``..data`` at a new
    timestamped directory (one rename): the file's path never changes, its resolved path does."""
    async with GatedUpstream("a") as a, GatedUpstream("b") as b, aiohttp.ClientSession() as http:
        port = free_port()
        for name, up in (("v1", a), ("v2", b)):
            (tmp_path / name).mkdir()
            (tmp_path / name / "config.yaml").write_text(config_text(up.endpoint, port=port))
        (tmp_path / "..data").symlink_to("v1")
        cfg = tmp_path / "config.yaml"
        cfg.symlink_to("..data/config.yaml")
        async with App(load_file(cfg), config_path=cfg) as app:
            reloaded = asyncio.Event()

            async def on_change() -> None:
                await app.reload()
                reloaded.set()

            watcher = ConfigWatcher(cfg, on_change, interval=0.02)
            watcher.start()
            try:
                async with http.get(f"http://127.0.0.1:{port}/") as r:
                    assert await r.text() == "a"
                (tmp_path / "..data_tmp").symlink_to("v2")
                os.rename(tmp_path / "..data_tmp", tmp_path / "..data")
                async with asyncio.timeout(30):
                    await reloaded.wait()
                async with http.get(f"http://127.0.0.1:{port}/") as r:
                    assert await r.text() == "b"
            finally:
                await watcher.stop()


async def test_an_invalid_config_is_refused_with_every_error_and_the_old_one_keeps_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "config.yaml"
    async with GatedUpstream("a") as a, aiohttp.ClientSession() as http:
        port = free_port()
        cfg.write_text(config_text(a.endpoint, port=port))
        async with App(load_file(cfg), config_path=cfg) as app:
            assert app.admin is not None
            admin = "http://{}:{}".format(*app.admin.address)
            cfg.write_text(
                config_text(a.endpoint, port=port).replace("max_attempts: 1", "max_attempts: zero")
                + "  - {name: other, protocol: http, listen: '127.0.0.1:1', upstream: nowhere}\n"
            )
            with caplog.at_level(logging.ERROR, logger="sidecar"):
                assert not await app.reload()
            logged = caplog.text
            assert "policies.p.max_attempts" in logged
            assert "listeners[1].upstream: no upstream named 'nowhere'" in logged
            assert await metric(http, admin, "rejected") == 1
            async with http.get(f"http://127.0.0.1:{port}/") as r:
                assert (r.status, await r.text()) == (200, "a")
            async with http.get(f"{admin}/config") as r:
                assert (await r.json())["policies"]["p"]["max_attempts"] == 1


async def test_a_listener_address_change_is_refused_as_needing_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "config.yaml"
    async with GatedUpstream("a") as a, GatedUpstream("b") as b, aiohttp.ClientSession() as http:
        port, other = free_port(), free_port()
        cfg.write_text(config_text(a.endpoint, port=port))
        async with App(load_file(cfg), config_path=cfg) as app:
            cfg.write_text(config_text(b.endpoint, port=port, listen=f"127.0.0.1:{other}"))
            with caplog.at_level(logging.ERROR, logger="sidecar"):
                assert not await app.reload()
            assert (
                f"listeners.orders.listen: changed from '127.0.0.1:{port}' to '127.0.0.1:{other}'"
                in caplog.text
            )
            assert "needs a restart" in caplog.text
            registry = app.telemetry.metrics.registry
            assert registry.get_sample_value("sidecar_config_reloads_total", {"result": "rejected"}) == 1
            async with http.get(f"http://127.0.0.1:{port}/") as r:
                assert await r.text() == "a"  # the endpoint change came with it: refused as a whole


def two_listeners(endpoint: str, port: int, other: int | None) -> str:
    """``orders`` on ``port``, and ``extra`` on ``other`` when given."""
    text = config_text(endpoint, port=port)
    if other is not None:
        text += (
            f'  - {{name: extra, protocol: http, listen: "127.0.0.1:{other}", upstream: orders, policy: p}}\n'
        )
    return text


async def test_a_reload_adds_a_listener_and_removes_it_after_its_request_in_flight(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    async with GatedUpstream("a") as a, aiohttp.ClientSession() as http:
        port, other = free_port(), free_port()
        cfg.write_text(two_listeners(a.endpoint, port, None))
        async with App(load_file(cfg), config_path=cfg) as app:
            cfg.write_text(two_listeners(a.endpoint, port, other))
            assert await app.reload()
            assert app.is_ready() and app.address("extra")[1] == other
            async with http.get(f"http://127.0.0.1:{other}/") as r:
                assert (r.status, await r.text()) == (200, "a")

            a.gate.clear()
            a.arrived.clear()
            in_flight = asyncio.create_task(http.get(f"http://127.0.0.1:{other}/"))
            await a.arrived.wait()
            cfg.write_text(two_listeners(a.endpoint, port, None))
            assert await app.reload()
            with pytest.raises(KeyError):
                app.address("extra")
            with pytest.raises(OSError):  # it stopped accepting at the reload ...
                await asyncio.open_connection("127.0.0.1", other)
            a.gate.set()
            async with await in_flight as r:  # ... and finished the request it held
                assert (r.status, await r.text()) == (200, "a")
            async with http.get(f"http://127.0.0.1:{port}/") as r:
                assert r.status == 200
            assert (
                app.telemetry.metrics.registry.get_sample_value(
                    "sidecar_config_reloads_total", {"result": "applied"}
                )
                == 2
            )


async def test_a_listener_that_cannot_bind_refuses_the_whole_reload(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "config.yaml"
    async with GatedUpstream("a") as a, GatedUpstream("b") as b, aiohttp.ClientSession() as http:
        port = free_port()
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            busy = taken.getsockname()[1]
            cfg.write_text(two_listeners(a.endpoint, port, None))
            async with App(load_file(cfg), config_path=cfg) as app:
                cfg.write_text(two_listeners(b.endpoint, port, busy))
                with caplog.at_level(logging.ERROR, logger="sidecar"):
                    assert not await app.reload()
                assert "listeners.extra: cannot start" in caplog.text
                assert [lst.name for lst in app.listeners] == ["orders"]
                async with http.get(f"http://127.0.0.1:{port}/") as r:
                    assert await r.text() == "a"  # the endpoint change came with it: refused as a whole


async def test_a_listener_that_fails_to_start_after_its_address_was_tried_leaves_the_live_config_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two new listeners on the same port, one written 127.0.0.1 and one localhost (the loader cannot tell
    they clash): each address is free when tried, the second cannot bind once the first did. The config the
    reload built services for is undone: the old endpoint still serves, and the next reload applies."""
    cfg = tmp_path / "config.yaml"
    async with GatedUpstream("a") as a, GatedUpstream("b") as b, aiohttp.ClientSession() as http:
        port, other = free_port(), free_port()
        cfg.write_text(two_listeners(a.endpoint, port, None))
        async with App(load_file(cfg), config_path=cfg) as app:
            clash = (
                f'  - {{name: x, protocol: http, listen: "127.0.0.1:{other}", upstream: orders}}\n'
                f'  - {{name: y, protocol: http, listen: "localhost:{other}", upstream: orders}}\n'
            )
            cfg.write_text(two_listeners(b.endpoint, port, None) + clash)
            with caplog.at_level(logging.ERROR, logger="sidecar"):
                assert not await app.reload()
            assert "listeners.y: cannot start" in caplog.text
            assert [lst.name for lst in app.listeners] == ["orders"]
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", other)  # x was stopped again
            async with http.get(f"http://127.0.0.1:{port}/") as r:
                assert (r.status, await r.text()) == (200, "a")
            cfg.write_text(two_listeners(b.endpoint, port, other))
            assert await app.reload()
            async with http.get(f"http://127.0.0.1:{other}/") as r:
                assert (r.status, await r.text()) == (200, "b")


GRPC_CONFIG = """
admin: {{listen: "127.0.0.1:0"}}
upstreams:
  svc: {{endpoints: ["{endpoint}"]}}
listeners:
  - {{name: svc, protocol: grpc, listen: "127.0.0.1:{port}", upstream: svc}}
"""


async def test_a_grpc_listener_sends_new_calls_to_the_new_endpoint(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    port = free_port()
    async with GrpcUpstream() as a, GrpcUpstream() as b:
        cfg.write_text(GRPC_CONFIG.format(endpoint=a.endpoint, port=port))
        async with App(load_file(cfg), config_path=cfg) as app:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary("/pkg.Svc/Get")
                await call(b"one")
                cfg.write_text(GRPC_CONFIG.format(endpoint=b.endpoint, port=port))
                assert await app.reload()
                await call(b"two")  # on the same client channel: the listener kept its connection
            assert (a.count, b.count) == (1, 1)


MONGO_CONFIG = """
admin: {{listen: "127.0.0.1:0"}}
policies:
  db: {{extends: mongodb-backpressure, max_attempts: {attempts}}}
upstreams:
  db: {{endpoints: ["{endpoint}"]}}
listeners:
  - {{name: db, protocol: mongodb, listen: "127.0.0.1:{port}", upstream: db, policy: db}}
"""


async def test_a_mongodb_listener_takes_a_new_policy_and_refuses_new_members(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "config.yaml"
    server = MongoTestServer("mongos")
    other = MongoTestServer("mongos")
    await server.start()
    await other.start()
    port = free_port()
    try:
        cfg.write_text(MONGO_CONFIG.format(endpoint=server.endpoint, attempts=2, port=port))
        async with App(load_file(cfg), config_path=cfg) as app:
            client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(
                f"mongodb://127.0.0.1:{port}/?directConnection=true"
            )
            try:
                assert (await client.admin.command("ping"))["ok"] == 1
                cfg.write_text(MONGO_CONFIG.format(endpoint=server.endpoint, attempts=3, port=port))
                assert await app.reload()
                assert app.listeners[0].up.policy.engine.max_attempts == 3  # type: ignore[attr-defined]
                cfg.write_text(MONGO_CONFIG.format(endpoint=other.endpoint, attempts=3, port=port))
                with caplog.at_level(logging.ERROR, logger="sidecar"):
                    assert not await app.reload()
                assert "upstreams.db: the MongoDB listener 'db' monitors" in caplog.text
                assert (await client.admin.command("ping"))["ok"] == 1  # the same client, still served
            finally:
                await client.close()
    finally:
        await other.stop()
        await server.stop()
