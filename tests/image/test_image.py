"""The image as it ships, run by podman the way a pod runs it: read-only root filesystem, uid 10001, every
capability dropped, host networking on free loopback ports. Through it: the admin endpoints, one request per
protocol to a real upstream, a reload on SIGHUP, and a SIGTERM drain with requests in flight (none lost)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
from aiohttp import web
from pymongo import AsyncMongoClient

from sidecar.testing.grpc_upstream import GrpcUpstream
from sidecar.testing.http_upstream import FaultyUpstream
from sidecar.testing.mongo import MongoTestServer

from .conftest import IMAGE
from .podman import Container, podman

SECURE = ["--read-only", "--cap-drop=ALL", "--security-opt", "no-new-privileges", "--user", "10001:10001"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_image_runs_compiled_as_uid_10001_with_nothing_but_the_sidecar() -> None:
    r = podman("run", "--rm", *SECURE, IMAGE, "version")
    assert "hot path compiled with mypyc" in r.stdout, r.stdout
    cfg = json.loads(podman("image", "inspect", IMAGE).stdout)[0]["Config"]
    assert cfg["User"] == "10001:10001"
    assert cfg["Entrypoint"] == ["sidecar"] and cfg["Cmd"] == ["run", "-c", "/etc/sidecar/config.yaml"]
    assert cfg["StopSignal"] in ("SIGTERM", "15")
    probe = (
        "import importlib.util as u, shutil; "
        "print([m for m in ('pytest', 'matplotlib', 'numpy', 'mypy', 'hypothesis', 'pip', 'aiohttp', "
        "'prometheus_client') if u.find_spec(m)], "
        "shutil.which('gcc'), shutil.which('cc'))"
    )
    r = podman("run", "--rm", *SECURE, "--entrypoint", "python", IMAGE, "-c", probe)
    assert r.stdout.strip() == "[] None None", r.stdout


def test_the_demos_http_part_says_what_the_image_leaves_out() -> None:
    """aiohttp is the ``demo`` extra (issue 27): in the image, ``sidecar demo``'s HTTP part and the live
    simulation refuse with what to do, not a traceback."""
    r = podman("run", "--rm", *SECURE, IMAGE, "demo", "--only", "http", check=False)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "the http part needs aiohttp" in r.stderr and "retry-sidecar[demo]" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    r = podman(
        "run", "--rm", *SECURE, IMAGE, "simulate", "--scenario", "flaky", "--engine", "live", check=False
    )
    assert r.returncode == 1 and "the live engine needs aiohttp" in r.stderr, (r.returncode, r.stderr)


class Gate:
    """An HTTP upstream whose answers wait for ``open``; ``arrived`` counts the requests waiting."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.arrived = 0
        self._changed = asyncio.Condition()
        self.endpoint = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        async with self._changed:
            self.arrived += 1
            self._changed.notify_all()
        await self.open.wait()
        return web.Response(text="done")

    async def wait_arrived(self, n: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.arrived >= n)

    async def __aenter__(self) -> Gate:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.endpoint = f"127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.open.set()
        assert self._runner is not None
        await self._runner.cleanup()


@contextlib.asynccontextmanager
async def run_sidecar(config_dir: Path) -> AsyncIterator[Container]:
    r = podman(
        "run", "-d", "--network", "host", *SECURE, "-v", f"{config_dir}:/etc/sidecar:ro", IMAGE,
        "run", "-c", "/etc/sidecar/config.yaml", "--watch-interval", "0",
    )  # fmt: skip
    ctr = Container(r.stdout.strip())
    await ctr.follow()
    try:
        yield ctr
    finally:
        await ctr.close()
        podman("rm", "-f", "-t", "0", ctr.cid, check=False)


def config(
    http_ep: str, gate_ep: str, grpc_ep: str, mongo_ep: str, ports: dict[str, int], attempts: int
) -> str:
    return f"""
admin: {{listen: "127.0.0.1:{ports["admin"]}"}}
shutdown: {{grace: 60s}}
policies:
  web: {{extends: http-default, max_attempts: {attempts}, backoff: {{initial: 1ms, max: 1ms}}}}
upstreams:
  web: {{endpoints: ["{http_ep}"]}}
  slow: {{endpoints: ["{gate_ep}"]}}
  svc: {{endpoints: ["{grpc_ep}"]}}
  db: {{endpoints: ["{mongo_ep}"]}}
listeners:
  - {{name: web, protocol: http, listen: "127.0.0.1:{ports["http"]}", upstream: web, policy: web}}
  - {{name: slow, protocol: http, listen: "127.0.0.1:{ports["slow"]}", upstream: slow}}
  - {{name: svc, protocol: grpc, listen: "127.0.0.1:{ports["grpc"]}", upstream: svc}}
  - {{name: db, protocol: mongodb, listen: "127.0.0.1:{ports["mongo"]}", upstream: db}}
"""


async def test_the_image_serves_every_protocol_reloads_and_drains(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("admin", "http", "slow", "grpc", "mongo")}
    mongo = MongoTestServer("mongos")
    await mongo.start()
    tmp_path.chmod(0o755)
    cfg = tmp_path / "config.yaml"
    try:
        async with (
            FaultyUpstream() as web_up,
            Gate() as gate,
            GrpcUpstream() as grpc_up,
            aiohttp.ClientSession() as http,
        ):
            eps = (web_up.endpoint, gate.endpoint, grpc_up.endpoint, mongo.endpoint)
            cfg.write_text(config(*eps, ports, attempts=1))
            cfg.chmod(0o644)
            async with run_sidecar(tmp_path) as ctr:
                await ctr.wait_for("admin on http://")
                admin = f"http://127.0.0.1:{ports['admin']}"
                for path in ("/healthz", "/readyz", "/metrics"):
                    async with http.get(admin + path) as r:
                        assert r.status == 200, path

                # One request per protocol.
                async with http.get(f"http://127.0.0.1:{ports['http']}/orders") as r:
                    assert r.status == 200
                async with grpc.aio.insecure_channel(f"127.0.0.1:{ports['grpc']}") as channel:
                    await channel.unary_unary("/pkg.Svc/Get")(b"x")
                assert grpc_up.count == 1
                client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(
                    f"mongodb://127.0.0.1:{ports['mongo']}/?directConnection=true"
                )
                try:
                    assert (await client.admin.command("ping"))["ok"] == 1
                finally:
                    await client.close()

                # A reload on SIGHUP: one attempt -> two, seen on the next request.
                web_up.fail_next(1)
                async with http.get(f"http://127.0.0.1:{ports['http']}/") as r:
                    assert r.status == 503
                cfg.write_text(config(*eps, ports, attempts=2))
                podman("kill", "--signal", "HUP", ctr.cid)
                await ctr.wait_for("config reloaded")
                web_up.fail_next(1)
                async with http.get(f"http://127.0.0.1:{ports['http']}/") as r:
                    assert r.status == 200
                async with http.get(admin + "/metrics") as r:
                    assert 'sidecar_config_reloads_total{result="applied"} 1.0' in await r.text()

                # SIGTERM with requests in flight: each is answered, then the process exits 0.
                inflight = [
                    asyncio.create_task(http.get(f"http://127.0.0.1:{ports['slow']}/")) for _ in range(10)
                ]
                await gate.wait_arrived(10)
                stop = asyncio.create_task(asyncio.to_thread(podman, "stop", "-t", "60", ctr.cid))
                await ctr.wait_for("shutting down: draining")
                gate.open.set()
                statuses = []
                for task in inflight:
                    async with await task as r:
                        statuses.append(r.status)
                assert statuses == [200] * 10  # none lost
                await stop
                assert podman("inspect", "-f", "{{.State.ExitCode}}", ctr.cid).stdout.strip() == "0"
    finally:
        await mongo.stop()


SLIM_PROBE = r"""
import json, pathlib, struct, sys, sysconfig

def sections(path):  # the names of an ELF64 file's sections
    data = path.read_bytes()
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    entsize, count, names_at = struct.unpack_from("<HHH", data, 0x3A)
    header = lambda i: struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize)
    table = header(names_at)[4]
    return {data[table + header(i)[0] : data.index(b"\0", table + header(i)[0])].decode() for i in range(count)}

venv = pathlib.Path(sys.prefix)
site = pathlib.Path(sysconfig.get_paths()["purelib"])
files = [p for p in venv.rglob("*") if p.is_file() and not p.is_symlink()]
print(json.dumps({
    "bytes": sum(p.stat().st_size for p in files),
    "stubs_and_sources": [str(p) for p in files if p.suffix in (".pyi", ".c", ".h", ".pyx", ".pxd")][:5],
    "debug_symbols": [str(p) for p in files if p.suffix == ".so" and ".debug_info" in sections(p)][:5],
    "shared_objects": sum(p.suffix == ".so" for p in files),
    "installers": [n for n in ("pip", "setuptools") if (site / n).exists()],
    "grpc_bytecode": any((site / "grpc" / "__pycache__").glob("_channel.*.pyc")),
    "pydantic_v1_bytecode": any((site / "pydantic" / "v1" / "__pycache__").glob("*.pyc")),
}))
"""


def test_the_venv_holds_what_the_sidecar_runs() -> None:
    """Issue 27: no installer, tests, type stubs, C sources or debug symbols, bytecode only for what the sidecar
    imports (grpcio's, not pydantic's v1 layer), and issue 27's 70 MB of files (69.9 MB now, since aiohttp
    became the demo extra and /metrics stopped needing prometheus_client). The bound leaves half a megabyte
    for the sidecar's own code to grow before someone has to look."""
    r = podman("run", "--rm", *SECURE, "--entrypoint", "python", IMAGE, "-c", SLIM_PROBE)
    found = json.loads(r.stdout)
    assert found["stubs_and_sources"] == [] and found["debug_symbols"] == [] and found["installers"] == []
    assert found["shared_objects"] > 10  # the check above looked at the compiled extensions
    assert found["grpc_bytecode"] and not found["pydantic_v1_bytecode"]
    assert found["bytes"] <= 70.5e6, f"the venv holds {found['bytes'] / 1e6:.1f} MB"
