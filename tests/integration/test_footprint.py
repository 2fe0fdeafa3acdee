"""What a running sidecar loads (issue 27): only what its config uses, read from the process itself - the
interpreter's record of every import (``PYTHONPROFILEIMPORTTIME=1``: each import is a line on stderr, at
start or later) and the shared objects mapped into it (/proc/PID/maps). A reload that adds a gRPC listener
loads grpcio then, and the listener serves."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from sidecar.testing.grpc_upstream import GrpcUpstream
from sidecar.testing.imports import HEAVY, imported, loaded_heavy, loads
from tests.metrics import until

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """``sidecar run`` as a user runs it, with the interpreter's import record on; stderr kept in a file."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, admin: int) -> None:
        self.proc = proc
        self.log = log
        self.admin = admin

    def imported(self) -> list[str]:
        return imported(self.log.read_text(errors="replace"))

    def mapped(self) -> str:
        """The files mapped into the process: its shared libraries and extension modules."""
        return Path(f"/proc/{self.proc.pid}/maps").read_text()

    def ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.admin), timeout=2) as s:
                s.sendall(b"GET /readyz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
                return s.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def logged(self, text: str) -> bool:
        return text in self.log.read_text(errors="replace")


@contextlib.asynccontextmanager
async def sidecar_run(config: Path, admin: int) -> AsyncIterator[Process]:
    log = config.with_suffix(".stderr")
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "run", "-c", str(config), "--watch-interval", "0"],
            stderr=err,
            cwd=ROOT,
            env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1", "PYTHONUNBUFFERED": "1"},
        )
    p = Process(proc, log, admin)
    try:
        await until(lambda: p.ready() or proc.poll() is not None, "the sidecar is ready")
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        yield p
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 30)


def http_config(port: int, admin: int, upstream: str, extra: str = "") -> str:
    return (
        f'admin: {{listen: "127.0.0.1:{admin}"}}\n'
        f'upstreams:\n  web: {{endpoints: ["{upstream}"]}}\n'
        f'  rpc: {{endpoints: ["{upstream}"]}}\n'
        f'listeners:\n  - {{name: web, protocol: http, listen: "127.0.0.1:{port}", upstream: web}}\n' + extra
    )


async def test_an_http_only_sidecar_loads_no_grpc_mongodb_redis_aiohttp_or_opentelemetry_until_a_reload_adds_grpc(
    tmp_path: Path,
) -> None:
    admin, port, grpc_port = free_port(), free_port(), free_port()
    cfg = tmp_path / "sidecar.yaml"
    async with GrpcUpstream() as upstream:
        cfg.write_text(http_config(port, admin, upstream.endpoint))
        async with sidecar_run(cfg, admin) as sc:
            modules = sc.imported()
            assert loads(modules, "sidecar.adapters.http"), "the import record is read"
            assert loaded_heavy(modules) == [], f"an HTTP-only config loaded {loaded_heavy(modules)}"
            assert not loads(modules, "typer")  # the CLI framework parses the other commands, not run
            assert not loads(modules, "importlib.metadata")  # pydantic's plugin loader (entry.py)
            assert not loads(modules, "shutil")  # argparse's own help formatter (run_command._Help)
            assert not loads(modules, "http.server")  # a web server: /metrics is written by exposition.py
            maps = sc.mapped()
            assert "httptools" in maps  # the extension modules it uses are mapped ...
            # cramjam: python-snappy's (pymongo's snappy compressor)
            absent = ("cygrpc", "_cbson", "_cmessage", "aiohttp", "cramjam", "cryptography")
            for extension in (*absent, "_pydantic_core"):
                if extension == "_pydantic_core":
                    assert extension in maps  # ... the config's validator included
                else:
                    assert extension not in maps, f"{extension} is mapped into an HTTP-only sidecar"

            # A reload adding a gRPC listener: grpcio is imported then, and the listener serves.
            cfg.write_text(
                http_config(port, admin, upstream.endpoint)
                + f'  - {{name: rpc, protocol: grpc, listen: "127.0.0.1:{grpc_port}", upstream: rpc}}\n'
            )
            sc.proc.send_signal(signal.SIGHUP)
            await until(lambda: sc.logged("config reloaded"), "the reload is applied")
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                assert await channel.unary_unary("/pkg.Svc/Get")(b"ping", timeout=10) == b"ping"
            assert upstream.count == 1
            after = sc.imported()
            assert loads(after, "grpc") and loads(after, "sidecar.adapters.grpc")
            assert "cygrpc" in sc.mapped()
            assert not any(
                loads(after, p) for p in ("pymongo", "bson", "redis", "dns", "aiohttp", "opentelemetry")
            )
            assert sc.ready()


async def test_a_mongodb_listener_loads_the_bson_codec_and_not_the_driver(tmp_path: Path) -> None:
    admin, port = free_port(), free_port()
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(
        f'admin: {{listen: "127.0.0.1:{admin}"}}\n'
        'upstreams:\n  db: {endpoints: ["127.0.0.1:9"]}\n'
        f'listeners:\n  - {{name: db, protocol: mongodb, listen: "127.0.0.1:{port}", upstream: db}}\n'
    )
    async with sidecar_run(cfg, admin) as sc:
        assert loaded_heavy(sc.imported()) == ["bson"]  # no pymongo: compression and mongodb+srv:// need it
        maps = sc.mapped()
        for extension in ("cramjam", "cryptography", "_cmessage"):
            assert extension not in maps, f"{extension} is mapped into a sidecar compressing nothing"


async def test_a_mongodb_listener_offering_compression_loads_pymongos_compression_with_the_first_compressed_command(
    tmp_path: Path,
) -> None:
    """The listener's ``compressors`` are offered from the start; pymongo's compression support (and with it
    the driver) is imported when a command arrives compressed, and the command is answered."""
    from pymongo import AsyncMongoClient

    from sidecar.testing.mongo import MongoTestServer

    admin, port = free_port(), free_port()
    cfg = tmp_path / "sidecar.yaml"
    async with MongoTestServer("mongos") as up:
        cfg.write_text(
            f'admin: {{listen: "127.0.0.1:{admin}"}}\n'
            f'upstreams:\n  db: {{endpoints: ["{up.endpoint}"]}}\n'
            f'listeners:\n  - {{name: db, protocol: mongodb, listen: "127.0.0.1:{port}", upstream: db, '
            "compressors: [zlib]}\n"
        )
        async with sidecar_run(cfg, admin) as sc:
            assert not loads(sc.imported(), "pymongo")
            client: AsyncMongoClient = AsyncMongoClient(
                f"mongodb://127.0.0.1:{port}/?compressors=zlib", serverSelectionTimeoutMS=10_000
            )
            try:
                await client.shop.things.insert_one({"n": 1})
                assert (await client.shop.things.find_one({"n": 1}))["n"] == 1
            finally:
                await client.close()
            assert loads(sc.imported(), "pymongo.compression_support")


def test_check_validates_every_key_without_loading_a_part(tmp_path: Path) -> None:
    """``sidecar check`` of a config using every part (three protocols, traces, admission, fleet) loads none
    of them: the schema needs no protocol library, so every key is checked whatever is installed."""
    cfg = tmp_path / "all.yaml"
    cfg.write_text(
        'telemetry: {traces: {exporter: otlp, endpoint: "http://127.0.0.1:4317"}}\n'
        'fleet: {redis: {url: "redis://127.0.0.1:6379/0"}}\n'
        "admission: {door: {requests: {rate: 100, scope: fleet}}}\n"
        "upstreams:\n"
        '  web: {endpoints: ["127.0.0.1:1"], retry_budget: {scope: fleet, ratio: 0.2}}\n'
        '  rpc: {endpoints: ["127.0.0.1:2"]}\n'
        '  db: {endpoints: ["127.0.0.1:3"], auth: {username: u, password: p}}\n'
        "listeners:\n"
        '  - {name: web, protocol: http, listen: "127.0.0.1:4", upstream: web, admission: door}\n'
        '  - {name: rpc, protocol: grpc, listen: "127.0.0.1:5", upstream: rpc}\n'
        '  - {name: db, protocol: mongodb, listen: "127.0.0.1:6", upstream: db}\n'
    )
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sidecar", "check", "-c", str(cfg)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert loaded_heavy(imported(r.stderr)) == []
    bad = cfg.read_text().replace("ratio: 0.2", "ratio: lots")
    cfg.write_text(bad)
    r = subprocess.run(
        [sys.executable, "-m", "sidecar", "check", "-c", str(cfg)], capture_output=True, text=True
    )
    assert r.returncode == 2 and "upstreams.web.retry_budget.ratio" in r.stderr


def test_the_import_record_names_what_is_watched() -> None:
    """The heavy packages the tests above look for are the ones the parts bring (a renamed package would
    make them pass without checking anything)."""
    r = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-c",
            "import grpc, pymongo, bson, redis, dns.resolver, aiohttp, prometheus_client, opentelemetry.sdk.trace",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert set(loaded_heavy(imported(r.stderr))) >= set(HEAVY) - {"google.protobuf", "opentelemetry.exporter"}


@pytest.mark.parametrize("exporter", ["console", "otlp"])
def test_traces_on_load_the_sdk(tmp_path: Path, exporter: str) -> None:
    """The other side: a config with traces loads the OpenTelemetry SDK (checked at start, in-process)."""
    code = (
        "import sys\n"
        "from sidecar.config import load_text\n"
        "from sidecar.telemetry import Telemetry\n"
        f"t = Telemetry(load_text('telemetry: {{traces: {{exporter: {exporter}}}}}', {{}}).telemetry)\n"
        "assert t.tracer is not None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk'))[:1])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "opentelemetry.sdk" in r.stdout
