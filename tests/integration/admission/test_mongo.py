"""The door on a MongoDB listener (issue 12), with real pymongo: commands beyond the rate get the seed's
error (code 462 IngressRequestRateLimitExceeded, SystemOverloadedError + RetryableError: the labels on
which pymongo 4.17+ backs off by itself) and never reach the upstream; exempt commands and addresses pass;
shadow mode counts without refusing; a connection flood is closed before any reply while pymongo's connections keep working."""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import bson
import pytest
from pymongo.errors import OperationFailure

from sidecar.testing.mongo import MongoTestServer
from tests.metrics import metric

from ..mongo.conftest import config, in_thread, sidecar


def with_admission(endpoint: str, profile: dict[str, Any]) -> dict[str, Any]:
    cfg = config([endpoint], listener={"admission": "front"})
    cfg["admission"] = {"front": profile}
    return cfg


def finds(client: Any, n: int) -> list[OperationFailure | None]:
    out: list[OperationFailure | None] = []
    for _ in range(n):
        try:
            client.test.c.find_one({})
            out.append(None)
        except OperationFailure as e:
            out.append(e)
    return out


async def test_commands_beyond_the_rate_get_462_with_the_overload_labels() -> None:
    profile = {"requests": {"rate": 1, "burst": "5s"}}
    async with MongoTestServer("mongos") as up, sidecar(with_admission(up.endpoint, profile)) as sc:
        client = sc.client()
        try:
            began = time.monotonic()
            results = await in_thread(lambda: finds(client, 20))
            elapsed = time.monotonic() - began
        finally:
            await in_thread(client.close)
        ok = results.count(None)
        assert 5 <= ok <= 5 + int(elapsed) + 1
        assert up.count("find") == ok
        e = next(r for r in results if r is not None)
        assert e.code == 462
        assert e.details is not None and e.details["codeName"] == "IngressRequestRateLimitExceeded"
        assert e.has_error_label("SystemOverloadedError") and e.has_error_label("RetryableError")
        assert "request rate limit of listener 'mongo' exceeded" in str(e)
        assert metric(sc.app, "sidecar_admission_rejected_total", listener="mongo") == 20 - ok
        spans = [s for s in sc.spans.get_finished_spans() if s.attributes.get("sidecar.admission.limiter")]
        assert len(spans) == 20 - ok and spans[0].name.startswith("find")


async def test_exempt_commands_and_addresses_pass_untouched() -> None:
    profile = {"requests": {"rate": 0.001, "burst": "1s"}}  # one command, then none for 1000 s
    async with MongoTestServer("mongos") as up, sidecar(with_admission(up.endpoint, profile)) as sc:
        client = sc.client()
        try:
            await in_thread(lambda: client.test.c.find_one({}))
            with pytest.raises(OperationFailure):
                await in_thread(lambda: client.test.c.find_one({}))
            for command in ("ping", "buildInfo"):
                assert (await in_thread(lambda c=command: client.admin.command(c)))["ok"] == 1.0
        finally:
            await in_thread(client.close)
        assert up.count("ping") == 1 and up.count("buildinfo") + up.count("buildInfo") == 1
        assert metric(sc.app, "sidecar_admission_exempted_total", listener="mongo") >= 2  # + hello, endSessions
    exempt = {"requests": {"rate": 0.001, "burst": "1s", "exempt_cidrs": ["127.0.0.0/8"]}}
    async with MongoTestServer("mongos") as up, sidecar(with_admission(up.endpoint, exempt)) as sc:
        client = sc.client()
        try:
            assert await in_thread(lambda: finds(client, 5)) == [None] * 5
        finally:
            await in_thread(client.close)


async def test_shadow_mode_refuses_nothing_and_counts_everything() -> None:
    profile = {"requests": {"rate": 0.001, "burst": "1s"}, "shadow": True}
    async with MongoTestServer("mongos") as up, sidecar(with_admission(up.endpoint, profile)) as sc:
        client = sc.client()
        try:
            assert await in_thread(lambda: finds(client, 10)) == [None] * 10
        finally:
            await in_thread(client.close)
        assert up.count("find") == 10
        assert metric(sc.app, "sidecar_admission_rejected_total", listener="mongo", shadow="true") == 9


async def test_a_connection_flood_is_closed_before_any_reply_while_pymongo_keeps_working() -> None:
    # five connections, then one per 1000 s; none may wait
    profile = {"connections": {"rate": 0.001, "burst": "5000s", "max_queue": 0}}
    async with MongoTestServer("mongos") as up, sidecar(with_admission(up.endpoint, profile)) as sc:
        client = sc.client(maxPoolSize=1)
        try:
            await in_thread(lambda: client.test.c.insert_one({"a": 1}))
            replies = [await hello_reply(sc.host, sc.port) for _ in range(10)]
            # the tokens pymongo left are spent by the first few; every later connection is closed unanswered
            assert replies[-5:] == [None] * 5
            assert replies.count(None) >= 5 and all(r is None for r in replies[replies.index(None):])
            assert (await in_thread(lambda: client.test.c.find_one({})))["a"] == 1
        finally:
            await in_thread(client.close)
        refused = metric(sc.app, "sidecar_admission_rejected_total", listener="mongo", limiter="connections")
        assert refused == replies.count(None)


async def hello_reply(host: str, port: int) -> dict[str, Any] | None:
    """Connect, send OP_MSG hello, read the reply; ``None`` when closed (or reset) before any reply."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        body = bson.encode({"hello": 1, "$db": "admin"})
        payload = struct.pack("<I", 0) + b"\x00" + body
        writer.write(struct.pack("<iiii", 16 + len(payload), 1, 0, 2013) + payload)
        try:
            header = await reader.readexactly(16)
        except (asyncio.IncompleteReadError, ConnectionResetError):
            return None
        (length,) = struct.unpack("<i", header[:4])
        rest = await reader.readexactly(length - 16)
        return bson.decode(rest[5:])
    finally:
        writer.close()
