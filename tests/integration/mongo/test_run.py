"""``sidecar run`` (the real process, uvloop) in front of the test server, driven by pymongo."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pymongo

from sidecar.testing.mongo import MongoTestServer

from .conftest import NO_DRIVER_RETRIES, OVERLOAD, in_thread


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_sidecar_run_with_uvloop_retries_for_pymongo(tmp_path: Path) -> None:
    async with MongoTestServer("mongos") as up:
        port = _free_port()
        cfg = tmp_path / "sidecar.yaml"
        cfg.write_text(
            "admin: {listen: null}\n"
            f"upstreams: {{db: {{endpoints: ['{up.endpoint}']}}}}\n"
            f"listeners: [{{name: m, protocol: mongodb, listen: '127.0.0.1:{port}', upstream: db}}]\n"
        )
        sidecar = str(Path(sys.executable).parent / "sidecar")
        proc = await asyncio.create_subprocess_exec(
            sidecar, "run", "-c", str(cfg), stderr=asyncio.subprocess.PIPE
        )
        try:
            up.fail_command(["find"], times=2, **OVERLOAD)
            client = pymongo.MongoClient(
                f"mongodb://127.0.0.1:{port}/?{NO_DRIVER_RETRIES}", serverSelectionTimeoutMS=10000
            )
            try:
                await in_thread(lambda: client.test.c.insert_one({"a": 1}))
                doc = await in_thread(lambda: client.test.c.find_one({"a": 1}))
            finally:
                await in_thread(client.close)
            assert doc is not None and doc["a"] == 1
            assert up.count("find") == 3
        finally:
            proc.terminate()
            await proc.wait()
