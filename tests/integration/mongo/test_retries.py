"""The Client Backpressure retry policy, observed from both ends: what pymongo gets, what the upstream saw."""

from __future__ import annotations

import pymongo
import pytest
from pymongo.errors import OperationFailure

from sidecar.testing.mongo import MongoTestServer

from .conftest import OVERLOAD, config, in_thread, sidecar

OPERATIONS = {
    "find": (["find"], lambda db: db.c.find_one({"a": 1})),
    "insert": (["insert"], lambda db: db.c.insert_one({"a": 2})),
    "update": (["update"], lambda db: db.c.update_many({}, {"$inc": {"a": 1}})),
    "command": (["dbStats"], None),
}


@pytest.mark.parametrize("op", ["find", "insert", "update"])
async def test_overloaded_twice_then_success_is_one_call_for_the_app(op: str) -> None:
    names, run = OPERATIONS[op]
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        up.fail_command(names, times=2, **OVERLOAD)
        client = sc.client()
        try:
            await in_thread(lambda: run(client.test))
        finally:
            await in_thread(client.close)
        assert up.count(names[0]) == 3


async def test_a_generic_command_is_retried_too() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        up.fail_command(["ping"], times=2, **OVERLOAD)
        client = sc.client()
        try:
            reply = await in_thread(lambda: client.admin.command("ping"))
        finally:
            await in_thread(client.close)
        assert reply["ok"] == 1.0
        assert up.count("ping") == 3


async def test_async_pymongo_gets_one_answer_after_two_overloads() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        up.fail_command(["insert"], times=2, **OVERLOAD)
        client = pymongo.AsyncMongoClient(sc.uri())
        try:
            await client.test.c.insert_one({"x": 1})
            assert await client.test.c.count_documents({}) == 1
        finally:
            await client.close()
        assert up.count("insert") == 3


async def test_overloaded_on_every_attempt_gives_six_attempts_and_an_error_without_retryable_label() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        up.fail_command(["find"], **OVERLOAD)
        e = await sc.failure(lambda client: client.test.c.find_one())
        assert up.count("find") == 6
        assert e.value.code == 462
        assert e.value.has_error_label("SystemOverloadedError")
        assert not e.value.has_error_label("RetryableError")


async def test_final_error_labels_keep_leaves_the_labels() -> None:
    cfg = config([], policy={"final_error_labels": "keep", "max_attempts": 2})
    async with MongoTestServer("mongos") as up:
        cfg["upstreams"]["db"]["endpoints"] = [up.endpoint]
        async with sidecar(cfg) as sc:
            up.fail_command(["find"], **OVERLOAD)
            e = await sc.failure(lambda client: client.test.c.find_one())
    assert up.count("find") == 2
    assert e.value.has_error_label("RetryableError")


async def test_a_backpressure_aware_driver_with_its_defaults_does_not_multiply_attempts() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        up.fail_command(["find", "insert"], **OVERLOAD)
        client = sc.client(options="")  # pymongo's defaults: retryReads, retryWrites, maxAdaptiveRetries=2
        try:
            with pytest.raises(OperationFailure):
                await in_thread(lambda: client.test.c.find_one())
            with pytest.raises(OperationFailure):
                await in_thread(lambda: client.test.c.insert_one({"a": 1}))
        finally:
            await in_thread(client.close)
        assert up.count("find") == 6
        assert up.count("insert") == 6


async def test_a_non_retryable_error_goes_back_unchanged_after_one_attempt() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        up.fail_command(["find"], error_code=2, error_labels=["SystemOverloadedError"])  # no RetryableError
        e = await sc.failure(lambda client: client.test.c.find_one())
        assert up.count("find") == 1 and e.value.code == 2


async def test_a_bucket_of_two_tokens_allows_two_retries() -> None:
    policy = {"throttle": {"kind": "mongodb", "capacity": 2}}
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint], policy)) as sc:
        up.fail_command(["find"], **OVERLOAD)
        await sc.failure(lambda client: client.test.c.find_one())
        assert up.count("find") == 3


async def test_the_retry_goes_to_the_other_mongos() -> None:
    # rand = 0 makes the first pick the first router, which is overloaded
    async with (
        MongoTestServer("mongos") as a,
        MongoTestServer("mongos") as b,
        sidecar(config([a.endpoint, b.endpoint])) as sc,
    ):
        a.fail_command(["find"], **OVERLOAD)
        client = sc.client()
        try:
            await in_thread(lambda: client.test.c.find_one())
        finally:
            await in_thread(client.close)
        assert a.count("find") == 1 and b.count("find") == 1


async def test_backoff_follows_the_formula_with_the_injected_jitter() -> None:
    # j = 0.1: waits of 10, 20, 40, 80, 160 ms before retries 1..5 (100 ms * 2^i, i from 0)
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint]), rand=lambda: 0.1) as sc:
        up.fail_command(["find"], times=5, **OVERLOAD)
        client = sc.client()
        try:
            await in_thread(lambda: client.test.c.find_one())
        finally:
            await in_thread(client.close)
        spans = [s for s in sc.spans.get_finished_spans() if s.attributes.get("sidecar.attempt")]
        waits = [
            s.attributes.get("sidecar.backoff_ms")
            for s in sorted(spans, key=lambda s: s.attributes["sidecar.attempt"])
        ]
        assert waits[:5] == pytest.approx([10.0, 20.0, 40.0, 80.0, 160.0])
        times = [c.t for c in up.commands("find")]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        for gap, wait in zip(gaps, waits, strict=False):
            assert gap >= wait / 1000.0 * 0.9  # the wait happened (lower bound only: never flaky)


async def test_a_server_sent_base_backoff_replaces_the_base() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint]), rand=lambda: 0.5) as sc:
        up.fail_command(["find"], times=2, base_backoff_ms=4, **OVERLOAD)
        client = sc.client()
        try:
            await in_thread(lambda: client.test.c.find_one())
        finally:
            await in_thread(client.close)
        spans = [s for s in sc.spans.get_finished_spans() if s.attributes.get("sidecar.backoff_ms")]
        waits = sorted(s.attributes["sidecar.backoff_ms"] for s in spans)
        assert waits == pytest.approx([2.0, 4.0])  # 0.5 * 4 ms * 2^i


async def test_no_writes_performed_on_the_retry_returns_the_earlier_error() -> None:
    async with (
        MongoTestServer("mongos") as a,
        MongoTestServer("mongos") as b,
        sidecar(config([a.endpoint, b.endpoint])) as sc,
    ):
        a.fail_command(["insert"], **OVERLOAD)
        b.fail_command(["insert"], error_code=91, error_labels=["NoWritesPerformed"])
        e = await sc.failure(lambda client: client.test.c.insert_one({"a": 1}))
        assert a.count("insert") == 1 and b.count("insert") == 1
        assert e.value.code == 462  # the first error, not the NoWritesPerformed one


async def test_a_retried_insert_is_applied_once() -> None:
    wce = {"code": 91, "errmsg": "Replication is being shut down", "errorLabels": ["RetryableWriteError"]}
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        up.fail_command(["insert"], times=1, write_concern_error=wce)
        client = sc.client("retryWrites=true&maxAdaptiveRetries=0")  # txnNumber is sent: the server dedupes
        try:
            await in_thread(lambda: client.test.c.insert_one({"a": 1}))
            assert await in_thread(lambda: client.test.c.count_documents({})) == 1
        finally:
            await in_thread(client.close)
        inserts = up.commands("insert")
        assert len(inserts) == 2
        first, second = (c.body for c in inserts)
        assert first["lsid"] == second["lsid"] and first["txnNumber"] == second["txnNumber"]
        assert up.handlers.applied_writes == 1


async def test_retries_are_byte_identical_apart_from_max_time() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        up.fail_command(["update"], times=2, **OVERLOAD)
        client = sc.client("retryWrites=true&maxAdaptiveRetries=0")
        try:
            await in_thread(lambda: client.test.c.update_one({"a": 1}, {"$set": {"b": 2}}, upsert=True))
        finally:
            await in_thread(client.close)
        bodies = [c.body for c in up.commands("update")]
        assert len(bodies) == 3 and bodies[0] == bodies[1] == bodies[2]
        assert up.handlers.applied_writes == 1


async def test_a_hedging_policy_hedges_reads_but_never_writes() -> None:
    policy = {"hedging": {"max_attempts": 2, "delay": "0ms"}}
    async with (
        MongoTestServer("mongos") as a,
        MongoTestServer("mongos") as b,
        sidecar(config([a.endpoint, b.endpoint], policy)) as sc,
    ):
        for s in (a, b):
            s.fail_command(["find", "insert"], times=1, block_connection=True, block_time_ms=50)
        client = sc.client()
        try:
            await in_thread(lambda: client.test.c.find_one())
            await in_thread(lambda: client.test.c.insert_one({"a": 1}))
        finally:
            await in_thread(client.close)
        assert a.count("find") + b.count("find") == 2  # two copies of the read at once
        assert a.count("insert") + b.count("insert") == 1


async def test_async_pymongo_gets_the_error_without_retryable_label_after_six_attempts() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        up.fail_command(["update"], **OVERLOAD)
        client = pymongo.AsyncMongoClient(sc.uri(""))  # pymongo's defaults: it would retry overloads itself
        try:
            with pytest.raises(OperationFailure) as e:
                await client.test.c.update_many({}, {"$set": {"a": 1}})
        finally:
            await client.close()
        assert up.count("update") == 6
        assert e.value.has_error_label("SystemOverloadedError") and not e.value.has_error_label(
            "RetryableError"
        )
