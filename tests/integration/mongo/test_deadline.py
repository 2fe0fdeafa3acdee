"""maxTimeMS is the request's deadline: each attempt carries what remains; expiry is code 50."""

from __future__ import annotations

import pytest
from pymongo.errors import ExecutionTimeout, OperationFailure

from sidecar.testing.mongo import MongoTestServer, TestReplicaSet

from .conftest import OVERLOAD, config, in_thread, sidecar


async def test_each_attempt_carries_the_time_that_remains() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint]), rand=lambda: 1.0) as sc:
        up.fail_command(["find"], times=2, **OVERLOAD)
        client = sc.client()
        try:
            await in_thread(lambda: client.test.c.find_one({}, max_time_ms=5000))
        finally:
            await in_thread(client.close)
        sent = [c.body["maxTimeMS"] for c in up.commands("find")]
        assert len(sent) == 3
        assert all(0 < ms <= 5000 for ms in sent)
        # the waits were 100 ms then 200 ms: each attempt got at least that much less
        assert sent[1] <= sent[0] - 100 and sent[2] <= sent[1] - 200


async def test_a_policy_deadline_adds_max_time_to_commands_without_one() -> None:
    cfg = config([], policy={"deadline": {"default": "3s"}})
    async with MongoTestServer("mongos") as up:
        cfg["upstreams"]["db"]["endpoints"] = [up.endpoint]
        async with sidecar(cfg) as sc:
            client = sc.client()
            try:
                await in_thread(lambda: client.test.c.find_one())
            finally:
                await in_thread(client.close)
    (find,) = up.commands("find")
    assert 0 < find.body["maxTimeMS"] <= 3000


async def test_an_expired_deadline_is_code_50_and_never_reaches_the_upstream() -> None:
    async with TestReplicaSet(2) as rs:
        for m in rs.members:
            m.set_role("secondary", primary="")  # no primary: writes wait for one
        cfg = config(rs.endpoints, upstream={"replica_set": "rs0"})
        async with sidecar(cfg) as sc:
            client = sc.client()
            try:
                with pytest.raises(OperationFailure) as e:
                    await in_thread(
                        lambda: client.test.command("insert", "c", documents=[{"a": 1}], maxTimeMS=200)
                    )
            finally:
                await in_thread(client.close)
    assert e.value.code == 50
    assert all(m.count("insert") == 0 for m in rs.members)


async def test_the_deadline_passing_during_an_attempt_answers_code_50() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        up.fail_command(["find"], times=1, block_connection=True, block_time_ms=3000)
        client = sc.client()
        try:
            with pytest.raises(ExecutionTimeout) as e:
                await in_thread(lambda: client.test.c.find_one({}, max_time_ms=150))
            assert await in_thread(lambda: client.test.c.find_one()) is None  # the sidecar is fine
        finally:
            await in_thread(client.close)
    assert e.value.code == 50


async def test_a_backoff_that_would_cross_the_deadline_returns_the_current_error() -> None:
    # j = 1: the first wait would be 100 ms, the deadline is 50 ms away
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint]), rand=lambda: 1.0) as sc:
        up.fail_command(["find"], **OVERLOAD)
        e = await sc.failure(lambda client: client.test.c.find_one({}, max_time_ms=50))
    assert up.count("find") == 1
    assert e.value.code == 462
