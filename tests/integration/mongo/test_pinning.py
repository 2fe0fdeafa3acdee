"""Cursors and transactions stay on the server that holds them; endSessions is answered and passed on."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure

from sidecar.testing.mongo import MongoTestServer
from sidecar.testing.mongo.storage import Storage

from .conftest import OVERLOAD, config, in_thread, sidecar


async def test_get_more_goes_to_the_server_that_opened_the_cursor() -> None:
    shared = Storage()  # two routers over the same data; cursors live in each router
    async with MongoTestServer("mongos", storage=shared) as a, MongoTestServer("mongos", storage=shared) as b:
        async with sidecar(
            config([a.endpoint, b.endpoint]), rand=__import__("random").Random(3).random
        ) as sc:
            client = sc.client()
            try:
                await in_thread(lambda: client.test.c.insert_many([{"i": i} for i in range(10)]))
                for _ in range(6):
                    docs = await in_thread(lambda: list(client.test.c.find().batch_size(3)))
                    assert len(docs) == 10
            finally:
                await in_thread(client.close)
        assert a.count("find") + b.count("find") == 6
        assert a.count("find") and b.count("find")  # both routers served cursors
        for server in (a, b):
            opened = {c.connection for c in server.commands("find")}
            assert server.count("getMore") == 3 * server.count("find")
            assert opened  # and no getMore failed with CursorNotFound
        assert not any("CursorNotFound" in str(c.body) for c in a.log + b.log)


async def test_a_transaction_stays_on_one_router_and_its_statements_are_not_retried() -> None:
    shared = Storage()
    async with MongoTestServer("mongos", storage=shared) as a, MongoTestServer("mongos", storage=shared) as b:
        async with sidecar(
            config([a.endpoint, b.endpoint]), rand=__import__("random").Random(1).random
        ) as sc:
            client = sc.client()

            def transaction() -> None:
                with client.start_session() as s, s.start_transaction():
                    client.test.c.insert_one({"n": 1}, session=s)
                    client.test.c.insert_one({"n": 2}, session=s)
                    client.test.c.find_one({"n": 1}, session=s)

            try:
                for _ in range(4):
                    await in_thread(transaction)
                # a statement that meets an overload is not retried by the sidecar: the app decides
                for s in (a, b):
                    s.fail_command(["insert"], times=1, **OVERLOAD)
                with pytest.raises(OperationFailure) as e:
                    await in_thread(transaction)
            finally:
                await in_thread(client.close)
        for server in (a, b):
            for c in server.commands():
                if c.name in ("insert", "find", "commitTransaction") and c.body.get("autocommit") is False:
                    txn = c.body["txnNumber"]
                    other = b if server is a else a
                    assert not any(
                        o.body.get("txnNumber") == txn and o.body.get("lsid") == c.body["lsid"]
                        for o in other.commands()
                    )
        assert e.value.has_error_label("RetryableError")  # labels kept: the sidecar did not retry it
        assert a.count("insert") + b.count("insert") == 4 * 2 + 1


async def test_end_sessions_is_answered_and_reaches_every_server() -> None:
    async with (
        MongoTestServer("mongos") as a,
        MongoTestServer("mongos") as b,
        sidecar(config([a.endpoint, b.endpoint])) as sc,
    ):
        client = sc.client()
        await in_thread(lambda: client.test.c.find_one())
        await in_thread(client.close)  # sends endSessions
        for s in (a, b):
            await s.wait_for(lambda s: s.count("endSessions") >= 1)


async def test_kill_cursors_goes_to_the_server_that_opened_the_cursor() -> None:
    shared = Storage()
    async with (
        MongoTestServer("mongos", storage=shared) as a,
        MongoTestServer("mongos", storage=shared) as b,
        sidecar(config([a.endpoint, b.endpoint]), rand=__import__("random").Random(5).random) as sc,
    ):
        client = sc.client()

        def open_and_abandon() -> None:
            cursor = client.test.c.find().batch_size(2)
            next(cursor)
            cursor.close()  # killCursors for a cursor still open on the server

        try:
            await in_thread(lambda: client.test.c.insert_many([{"i": i} for i in range(10)]))
            for _ in range(4):
                await in_thread(open_and_abandon)
        finally:
            await in_thread(client.close)
        for s in (a, b):
            assert s.count("killCursors") == s.count("find")
            assert not s.handlers.cursors  # every cursor was killed where it lived
