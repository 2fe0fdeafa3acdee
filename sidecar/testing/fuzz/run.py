"""The fuzzing run: upstreams in this process, ``sidecar run`` (uvloop, as deployed) in a child process with
one listener per format, inputs sent on connections of their own, a good client on another connection.

Each input: connect, (gRPC: the HTTP/2 preface and an empty SETTINGS), the input's bytes, a half-close, then
read until the sidecar closes or ``read_timeout`` passes. What fails a run: the sidecar exits; the good
client gets an error (checked every ``good_every`` inputs); the sidecar's log shows a traceback or an
internal error (reported with the indices that were in flight when it appeared).

One exception, counted apart (``Report.grpcio_defect``): a gRPC call that reaches a ``grpc.aio`` server in
the milliseconds between the death of its loop (a non-UTF-8 ``:path``, docs/grpc.md) and its shutdown is
failed by grpc core (CANCELLED, or UNAVAILABLE "Stream removed" by the shutdown's GOAWAY), and the sidecar
cannot reach it; such a good call is counted when it ended so and the sidecar logged a loop death meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
from pymongo import AsyncMongoClient

from .. import h2frames as h2
from ..grpc_upstream import GrpcUpstream
from ..http_upstream import FaultyUpstream
from ..mongo import MongoTestServer
from .inputs import GENERATORS

#: What in the sidecar's log means a bug of ours (bad input is logged as one line without any of these).
BAD_LOG = ("Traceback", "internal error", "Task exception was never retrieved", "Fatal error")


@dataclass
class Report:
    format: str
    seed: int
    count: int
    sent: int = 0
    good: int = 0
    grpcio_defect: int = 0  # good calls cancelled in the window of a grpc.aio loop death (see above)
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    def repro(self, indices: Sequence[int]) -> str:
        shown = ", ".join(str(i) for i in sorted(indices)[:8])
        return (
            f"seed {self.seed}, {self.format} input(s) {shown}: rebuild with "
            f"sidecar.testing.fuzz.inputs.{self.format}({self.seed}, <index>)"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sidecar:
    """``sidecar run`` with one listener per format; its stderr kept and watched."""

    def __init__(self, endpoints: dict[str, str]) -> None:
        self.endpoints = endpoints
        self.ports = {fmt: _free_port() for fmt in endpoints}
        self.lines: list[str] = []
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="sidecar-fuzz-")

    def config(self) -> str:
        ups = "".join(f"  {fmt}: {{endpoints: ['{ep}']}}\n" for fmt, ep in self.endpoints.items())
        lst = "".join(
            f"  - {{name: {fmt}, protocol: {fmt}, listen: '127.0.0.1:{self.ports[fmt]}', upstream: {fmt}}}\n"
            for fmt in self.endpoints
        )
        return f"admin: {{listen: null}}\nupstreams:\n{ups}listeners:\n{lst}"

    async def start(self) -> None:
        path = Path(self._dir.name) / "sidecar.yaml"
        path.write_text(self.config())
        exe = Path(sys.executable).parent / "sidecar"
        self.proc = await asyncio.create_subprocess_exec(
            str(exe),
            "run",
            "-c",
            str(path),
            "--log-level",
            "warning",
            "--watch-interval",
            "0",
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.get_running_loop().create_task(self._read())
        for fmt, port in self.ports.items():
            await self._wait_port(port, fmt)

    async def _wait_port(self, port: int, fmt: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError("sidecar exited at start:\n" + "".join(self.lines[-30:]))
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                return
            except OSError:
                await asyncio.sleep(0.05)
        raise RuntimeError(f"the {fmt} listener did not open port {port}")

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.lines.append(line.decode(errors="replace"))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def loop_died_since(self, since: int) -> bool:
        """Did the gRPC listener log a grpc.aio loop death after line ``since`` (its line may still be in
        the pipe: waits a little for it)?"""
        deadline = time.monotonic() + 2.0
        while True:
            if any("server loop died" in ln for ln in self.lines[since:]):
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)

    def bad_lines(self, since: int) -> list[str]:
        return [ln for ln in self.lines[since:] if any(b in ln for b in BAD_LOG)]

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(30):
                    await self.proc.wait()
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(BaseException):
                await self._reader
        self._dir.cleanup()


async def _send(port: int, data: bytes, read_timeout: float) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return  # a listener being rebuilt: the good client notices when that is a failure
    try:
        writer.write(data)
        if writer.can_write_eof():
            writer.write_eof()
        await writer.drain()
        async with asyncio.timeout(read_timeout):
            while await reader.read(65536):
                pass
    except (OSError, TimeoutError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


class GoodClients:
    """One well-behaved client per format, each on its own connection."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.ports = ports
        self.http: aiohttp.ClientSession | None = None
        self.channel: grpc.aio.Channel | None = None
        self.mongo: AsyncMongoClient | None = None
        self.n = 0

    async def __aenter__(self) -> GoodClients:
        self.http = aiohttp.ClientSession()
        if "grpc" in self.ports:
            self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.ports['grpc']}")
        if "mongodb" in self.ports:
            self.mongo = AsyncMongoClient(
                f"mongodb://127.0.0.1:{self.ports['mongodb']}/", serverSelectionTimeoutMS=20000
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.http is not None:
            await self.http.close()
        if self.channel is not None:
            await self.channel.close()
        if self.mongo is not None:
            await self.mongo.close()

    async def check(self, fmt: str) -> None:
        """One request that must succeed (raises otherwise)."""
        self.n += 1
        tag = f"good-{self.n}"
        async with asyncio.timeout(30):
            if fmt == "http":
                assert self.http is not None
                async with self.http.get(f"http://127.0.0.1:{self.ports['http']}/{tag}") as r:
                    body = await r.read()
                    if r.status != 200:
                        raise AssertionError(f"HTTP {r.status}: {body[:200]!r}")
            elif fmt == "grpc":
                assert self.channel is not None
                got = await self.channel.unary_unary("/pkg.Svc/Get")(tag.encode(), wait_for_ready=True)
                if got != tag.encode():
                    raise AssertionError(f"gRPC echo {got!r}")
            else:
                assert self.mongo is not None
                coll = self.mongo.good.c
                await coll.insert_one({"_id": tag})
                if await coll.find_one({"_id": tag}) is None:
                    raise AssertionError("MongoDB: the inserted document is not found")


async def fuzz_format(
    sidecar: Sidecar,
    clients: GoodClients,
    fmt: str,
    count: int,
    seed: int,
    *,
    start: int = 0,
    concurrency: int = 8,
    good_every: int = 100,
    read_timeout: float = 2.0,
    progress: Callable[[Report], None] | None = None,
) -> Report:
    report = Report(fmt, seed, count)
    generate = GENERATORS[fmt]
    port = sidecar.ports[fmt]
    prefix = h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0, b"") if fmt == "grpc" else b""
    next_index = start
    end = start + count
    in_flight: set[int] = set()
    log_seen = len(sidecar.lines)
    began = time.monotonic()
    stop = False

    async def worker() -> None:
        nonlocal next_index, log_seen, stop
        while not stop and next_index < end:
            i = next_index
            next_index += 1
            in_flight.add(i)
            try:
                await _send(port, prefix + generate(seed, i), read_timeout)
            finally:
                in_flight.discard(i)
            report.sent += 1
            seen_to = len(sidecar.lines)
            bad = sidecar.bad_lines(log_seen)
            log_seen = seen_to
            if bad:
                report.failures.append(
                    f"log: {bad[0].strip()[:300]} ({report.repro([i, *in_flight])}, or one just before)"
                )
            if not sidecar.alive():
                report.failures.append(f"the sidecar exited ({report.repro([i, *in_flight])})")
                stop = True
            elif report.sent % good_every == 0:
                mark = len(sidecar.lines)
                try:
                    await clients.check(fmt)
                    report.good += 1
                except grpc.aio.AioRpcError as e:
                    window = (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
                    if e.code() in window and await sidecar.loop_died_since(mark):
                        report.grpcio_defect += 1
                    else:
                        report.failures.append(
                            f"good client failed after input {i}: {e.code()} {e.details()} "
                            f"({report.repro(range(max(start, i - concurrency * 2), i + 1))})"
                        )
                except Exception as e:  # noqa: BLE001 - reported, with the inputs sent just before
                    report.failures.append(
                        f"good client failed after input {i}: {type(e).__name__}: {e} "
                        f"({report.repro(range(max(start, i - concurrency * 2), i + 1))})"
                    )
                if progress is not None:
                    progress(report)
            if len(report.failures) >= 10:
                stop = True

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    if sidecar.alive():
        try:
            await clients.check(fmt)
            report.good += 1
        except Exception as e:  # noqa: BLE001
            report.failures.append(f"good client failed at the end: {type(e).__name__}: {e}")
        await asyncio.sleep(0)  # let the last log lines in
        bad = sidecar.bad_lines(log_seen)
        if bad:
            report.failures.append(f"log: {bad[0].strip()[:300]} (seed {seed}, near the end of the run)")
    report.seconds = time.monotonic() - began
    return report


@contextlib.asynccontextmanager
async def running(formats: Sequence[str]):  # noqa: ANN201 - an async context manager of (Sidecar, GoodClients)
    """Upstreams, the sidecar in front of them, and the good clients. The upstreams' own complaints about
    what the sidecar passed on (an unknown HTTP method, a BSON document it does not decode: the sidecar
    forwards both, as a proxy should) are not the sidecar's log: they are kept quiet here."""
    quiet = [logging.getLogger(name) for name in ("aiohttp.server", "sidecar.testing.mongo")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.CRITICAL)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(lambda: [q.setLevel(lv) for q, lv in zip(quiet, levels, strict=True)])
        endpoints: dict[str, str] = {}
        if "http" in formats:
            endpoints["http"] = (await stack.enter_async_context(FaultyUpstream(keep_records=False))).endpoint
        if "grpc" in formats:
            endpoints["grpc"] = (await stack.enter_async_context(GrpcUpstream(keep_records=False))).endpoint
        if "mongodb" in formats:
            endpoints["mongodb"] = (await stack.enter_async_context(MongoTestServer("mongos"))).endpoint
        sidecar = Sidecar(endpoints)
        stack.push_async_callback(sidecar.stop)
        await sidecar.start()
        clients = await stack.enter_async_context(GoodClients(sidecar.ports))
        yield sidecar, clients
