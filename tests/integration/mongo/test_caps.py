"""The MongoDB listener's caps: ``max_connections`` (more wait in the kernel's backlog) and the process-wide
``limits.max_buffered_bytes`` (large stalled messages cannot take memory past it; others keep working)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
import threading
from pathlib import Path

import bson
import pymongo

from sidecar.adapters.mongo import wire
from sidecar.testing.mongo import MongoTestServer

from .conftest import NO_DRIVER_RETRIES, config, in_thread, sidecar

HELLO = wire.encode_body_msg(1, 0, bson.encode({"hello": 1, "$db": "admin"}))


async def hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    """One hello round trip; the reply's length."""
    writer.write(HELLO)
    head = await reader.readexactly(16)
    length = struct.unpack_from("<i", head)[0]
    await reader.readexactly(length - 16)
    return length


async def test_max_connections_leaves_the_next_in_the_backlog() -> None:
    async with (
        MongoTestServer("mongos") as up,
        sidecar(config([up.endpoint], listener={"max_connections": 2})) as sc,
    ):
        listener = sc.app.listeners[0]
        first = [await asyncio.open_connection(sc.host, sc.port) for _ in range(2)]
        for r, w in first:
            assert await hello(r, w) > 16
        # the kernel completes the third handshake (backlog); the sidecar does not take it
        r3, w3 = await asyncio.open_connection(sc.host, sc.port)
        w3.write(HELLO)
        await w3.drain()
        for r, w in first:  # round trips on the loop after the third arrived: it would have been accepted
            assert await hello(r, w) > 16
        assert len(listener._connections) == 2  # noqa: SLF001
        assert sc.app.is_ready()
        first[0][1].close()  # one leaves: the third gets in and is answered
        async with asyncio.timeout(10):
            head = await r3.readexactly(16)
        assert struct.unpack_from("<i", head)[0] > 16
        w3.close()
        first[1][1].close()


def _stall(host: str, port: int, message: memoryview, sent: threading.Event, stop: threading.Event) -> None:
    """Send all of ``message`` but its last byte, then hold the connection until ``stop``."""
    with socket.create_connection((host, port)) as s:
        s.settimeout(60)
        with contextlib.suppress(OSError):  # closed by the sidecar: that is allowed too
            s.sendall(message[:-1])
        sent.set()
        stop.wait(60)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_large_stalled_messages_stay_within_the_buffer_bound(tmp_path: Path) -> None:
    """Ten connections each send 20 MB of a 20 MB message and stall, against a 32 MiB budget: the process
    (`sidecar run`, uvloop) grows by at most the budget plus a margin, and a good client keeps working."""
    limit = 32 * 1024 * 1024
    size = 20 * 1000 * 1000
    body = bson.encode({"insert": "c", "$db": "test", "documents": [{"pad": b"x" * (size - 200)}]})
    message = memoryview(wire.encode_body_msg(7, 0, body))  # one copy, sent by every thread
    async with MongoTestServer("mongos") as up:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cfg = tmp_path / "sidecar.yaml"
        cfg.write_text(
            "admin: {listen: null}\n"
            f"limits: {{max_buffered_bytes: {limit}B}}\n"
            f"upstreams: {{db: {{endpoints: ['{up.endpoint}']}}}}\n"
            f"listeners: [{{name: m, protocol: mongodb, listen: '127.0.0.1:{port}', upstream: db,"
            " message_timeout: 2m, max_message_size: 30MiB}]\n"  # a message must fit in the budget
        )
        proc = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "sidecar"),
            "run",
            "-c",
            str(cfg),
            stderr=asyncio.subprocess.PIPE,
        )
        client = pymongo.MongoClient(
            f"mongodb://127.0.0.1:{port}/?{NO_DRIVER_RETRIES}", serverSelectionTimeoutMS=20000
        )
        stop = threading.Event()
        threads: list[threading.Thread] = []
        try:
            await in_thread(lambda: client.test.c.insert_one({"warm": 1}))
            before = _rss(proc.pid)
            sents = []
            for _ in range(10):
                sent = threading.Event()
                sents.append(sent)
                t = threading.Thread(
                    target=_stall, args=("127.0.0.1", port, message, sent, stop), daemon=True
                )
                t.start()
                threads.append(t)
            # the sidecar reads what fits in the budget (one whole message); the rest waits in socket buffers
            async with asyncio.timeout(60):
                while not any(e.is_set() for e in sents):
                    await asyncio.sleep(0.05)
            peak = _rss(proc.pid)
            for i in range(20):
                result = await in_thread(lambda i=i: client.test.c.insert_one({"good": i}))
                assert result.acknowledged
                peak = max(peak, _rss(proc.pid))
            assert await in_thread(lambda: client.test.c.count_documents({"good": {"$exists": True}})) == 20
            assert peak - before < limit + 24 * 1024 * 1024, (before, peak)
            assert sum(e.is_set() for e in sents) == 1  # 20 MB fits once in 32 MiB: the others wait
        finally:
            stop.set()
            await in_thread(client.close)
            proc.terminate()
            _, err = await proc.communicate()
            for t in threads:
                t.join(10)
    assert b"Traceback" not in err, err.decode()
