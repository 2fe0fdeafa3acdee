"""Execution control over MongoDB (issue 12): reads (find, aggregate without $out/$merge, count, distinct,
getMore, listCollections/listIndexes) take read tickets, everything else write tickets; the server never runs
more commands at once than the limit; a full queue is answered code 462 with SystemOverloadedError and
RetryableError; ping and the other exempt commands pass while the pool is exhausted. Real pymongo clients
(blocking, in threads), a real test server holding commands until the test lets them go: nothing sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pymongo.errors import OperationFailure

from sidecar.testing.mongo.server import MongoTestServer
from tests.metrics import metric

from .conftest import config, in_thread, sidecar


def limited(endpoints: list[str], concurrency: dict[str, Any], policy: dict[str, Any] | None = None) -> dict:
    return config(endpoints, policy, upstream={"concurrency": concurrency})


async def until(check: Callable[[], bool], what: str, bound: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + bound
    while not check():
        assert loop.time() < end, f"still not: {what}"
        await asyncio.sleep(0.005)


async def test_four_tickets_bound_the_server_from_32_clients() -> None:
    loop = asyncio.get_running_loop()
    async with MongoTestServer() as server, sidecar(
        limited([server.endpoint], {"mode": "fixed", "initial": 4, "max_wait": "60s"})
    ) as sc:
        client = sc.client()
        coll = client.test.items
        await in_thread(lambda: coll.insert_one({"_id": "seed"}))
        server.hold, server.held = asyncio.Event(), frozenset({"find", "insert"})
        peak_before = server.peak_in_flight

        def one(i: int) -> Any:
            if i % 2:
                return coll.find_one({"_id": "seed"})["_id"]
            return coll.insert_one({"_id": i}).inserted_id

        with ThreadPoolExecutor(32) as pool:
            calls = [loop.run_in_executor(pool, one, i) for i in range(32)]
            await server.wait_for(lambda s: s.in_flight >= 4)
            await until(lambda: metric(sc.app, "sidecar_concurrency_queued") == 28, "28 attempts queued")
            assert metric(sc.app, "sidecar_concurrency_in_use", pool="read") == 2
            assert metric(sc.app, "sidecar_concurrency_in_use", pool="write") == 2
            server.hold.set()
            results = await asyncio.gather(*calls)
        assert results == ["seed" if i % 2 else i for i in range(32)]
        assert peak_before == 1 and server.peak_in_flight == 4
        assert metric(sc.app, "sidecar_concurrency_in_use") == 0
        await in_thread(client.close)


async def test_a_full_queue_is_462_overloaded_while_exempt_commands_pass() -> None:
    loop = asyncio.get_running_loop()
    cc = {"mode": "fixed", "initial": 2, "max_queue": 0, "max_wait": "1s"}
    async with MongoTestServer() as server, sidecar(limited([server.endpoint], cc, {"max_attempts": 1})) as sc:
        client = sc.client()
        coll = client.test.items
        await in_thread(lambda: coll.insert_one({"_id": 1}))
        server.hold, server.held = asyncio.Event(), frozenset({"find"})
        with ThreadPoolExecutor(1) as pool:
            holding = loop.run_in_executor(pool, lambda: coll.find_one({"_id": 1}))  # the one read ticket
            await server.wait_for(lambda s: s.in_flight >= 1)
            with pytest.raises(OperationFailure) as e:
                await in_thread(lambda: coll.find_one({"_id": 1}))
            assert e.value.code == 462
            assert e.value.has_error_label("SystemOverloadedError")
            assert e.value.has_error_label("RetryableError")
            assert "concurrency limit" in str(e.value)
            assert (await in_thread(lambda: client.admin.command("ping")))["ok"] == 1.0  # exempt
            assert metric(sc.app, "sidecar_admission_exempted_total") == 1
            assert metric(sc.app, "sidecar_admission_rejected_total", pool="read", reason="queue-full") == 1
            assert (await in_thread(lambda: coll.insert_one({"_id": 2}))).inserted_id == 2  # the write pool
            server.hold.set()
            assert (await holding)["_id"] == 1
        assert server.count("find") == 1  # the refused find never reached the server
        await in_thread(client.close)
