"""How the sidecar looks to the app (a mongos), and how it follows its upstream (routers, a replica set)."""

from __future__ import annotations

import asyncio
import socket
import struct

import bson
import pymongo
import pytest
from pymongo.read_preferences import Secondary

from sidecar.adapters.mongo import wire
from sidecar.testing.mongo import MongoTestServer, TestReplicaSet

from .conftest import OVERLOAD, config, in_thread, sidecar


async def test_the_sidecar_answers_hello_itself_as_a_mongos_with_the_lowest_upstream_limits() -> None:
    async with (
        MongoTestServer("mongos", max_wire_version=17) as a,
        MongoTestServer("mongos") as b,
        sidecar(config([a.endpoint, b.endpoint])) as sc,
    ):
        client = sc.client()
        try:
            hello = await in_thread(lambda: client.admin.command("hello"))
            assert await in_thread(lambda: client.topology_description.topology_type_name) == "Sharded"
        finally:
            await in_thread(client.close)
    assert hello["msg"] == "isdbgrid" and hello["isWritablePrimary"] is True
    assert hello["maxWireVersion"] == 17 and hello["logicalSessionTimeoutMinutes"] == 30
    assert "topologyVersion" not in hello and "compression" not in hello
    assert not any(
        c.name == "hello" and "client" in c.body and "pymongo" in str(c.body["client"]) for c in a.log
    )


async def test_the_sidecar_handshakes_upstream_with_backpressure() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        client = sc.client()
        try:
            await in_thread(lambda: client.test.c.find_one())
        finally:
            await in_thread(client.close)
    handshakes = [c for c in up.commands("hello", include_hello=True) if "client" in c.body]
    assert handshakes and all(c.body["backpressure"] is True for c in handshakes)
    assert handshakes[0].body["client"]["driver"]["name"] == "retry-sidecar"


def _legacy_is_master(host: str, port: int) -> dict:
    query = bson.encode({"isMaster": 1})
    msg = wire.encode_query(7, "admin.$cmd", query)
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(msg)
        head = s.recv(16, socket.MSG_WAITALL)
        length, _, response_to, op = struct.unpack("<iiii", head)
        body = s.recv(length - 16, socket.MSG_WAITALL)
    assert op == wire.OP_REPLY and response_to == 7
    return bson.decode(wire.parse_reply(body).documents[0])


async def test_legacy_op_query_is_master_gets_an_op_reply() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        doc = await in_thread(lambda: _legacy_is_master(sc.host, sc.port))
    assert doc["ismaster"] is True and doc["msg"] == "isdbgrid"


async def test_authentication_from_the_app_gets_a_clear_error() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        client = pymongo.MongoClient(sc.uri(), username="u", password="p", serverSelectionTimeoutMS=3000)
        try:
            err = None
            try:
                await in_thread(lambda: client.test.c.find_one())
            except pymongo.errors.PyMongoError as e:
                err = e
        finally:
            await in_thread(client.close)
    assert err is not None and "authenticates to the upstream itself" in str(err)


async def test_replica_set_writes_go_to_the_primary_and_reads_follow_read_preference() -> None:
    async with TestReplicaSet(3) as rs:
        cfg = config([rs.endpoints[0]], upstream={"replica_set": "rs0"})  # one seed: the rest are discovered
        async with sidecar(cfg) as sc:
            client = sc.client()
            try:
                await in_thread(lambda: client.test.c.insert_one({"a": 1}))
                coll = client.test.get_collection("c", read_preference=Secondary())
                for _ in range(6):
                    await in_thread(lambda: coll.find_one())
            finally:
                await in_thread(client.close)
    primary, *secondaries = rs.members
    assert primary.count("insert") == 1 and primary.count("find") == 0
    assert sum(s.count("find") for s in secondaries) == 6


async def test_a_write_follows_an_election_to_the_new_primary() -> None:
    async with TestReplicaSet(3) as rs:
        cfg = config(rs.endpoints, upstream={"replica_set": "rs0"})
        async with sidecar(cfg) as sc:
            client = sc.client()
            try:
                await in_thread(lambda: client.test.c.insert_one({"a": 1}))
                rs.elect(2)
                await in_thread(lambda: client.test.c.insert_one({"a": 2}))
            finally:
                await in_thread(client.close)
    old, _, new = rs.members
    assert old.count("insert") == 2  # the first, and the one that met "not primary"
    assert new.count("insert") == 1


async def test_an_unreachable_upstream_is_an_overload_error_not_a_dropped_connection() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    async with sidecar(config([dead], upstream={"connect_timeout": "500ms"})) as sc:
        client = sc.client()
        try:
            err = None
            try:
                await in_thread(lambda: client.test.c.find_one())
            except pymongo.errors.OperationFailure as e:
                err = e
            # the app's view of the sidecar is intact: hello still works on the same client
            assert (await in_thread(lambda: client.admin.command("hello")))["ok"] == 1.0
        finally:
            await in_thread(client.close)
    assert err is not None and err.code == 133
    assert err.has_error_label("SystemOverloadedError") and not err.has_error_label("RetryableError")


async def test_overload_on_one_replica_set_member_does_not_move_writes_off_the_primary() -> None:
    async with TestReplicaSet(2) as rs:
        cfg = config(rs.endpoints, upstream={"replica_set": "rs0"})
        async with sidecar(cfg) as sc:
            rs.members[0].fail_command(["insert"], times=1, **OVERLOAD)
            client = sc.client()
            try:
                await in_thread(lambda: client.test.c.insert_one({"a": 1}))
            finally:
                await in_thread(client.close)
            await asyncio.sleep(0)
    assert rs.members[0].count("insert") == 2 and rs.members[1].count("insert") == 0


async def test_stopping_lets_a_command_in_flight_finish() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        up.fail_command(["find"], times=1, block_connection=True, block_time_ms=300)
        client = sc.client()
        try:
            find = asyncio.ensure_future(in_thread(lambda: client.test.c.find_one({"a": 1})))
            await up.wait_for(lambda s: s.count("find") == 1)
            await sc.app.stop(5.0)
            assert await find is None  # answered (no document), not cut off
        finally:
            await in_thread(client.close)


async def test_connections_the_upstream_closed_while_idle_are_not_reused() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        client = sc.client()
        try:
            await in_thread(lambda: client.test.c.insert_many([{"a": i} for i in range(3)]))
            up.close_connections()  # a restart, as the sidecar's pooled connections see it
            (listener,) = sc.app.listeners
            pool = listener.up.logins.own.get(up.endpoint)
            async with asyncio.timeout(5):
                while not all(c.closed for c in pool.idle):
                    await asyncio.sleep(0.01)
            # update_many is not retryable: it only works if no dead connection is used
            result = await in_thread(lambda: client.test.c.update_many({}, {"$set": {"b": 1}}))
            assert result.modified_count == 3
        finally:
            await in_thread(client.close)
    assert up.count("update") == 1


async def test_pymongo_csot_timeout_becomes_the_deadline() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint]), rand=lambda: 1.0) as sc:
        up.fail_command(["find"], **OVERLOAD)
        client = sc.client("timeoutMS=250&" + "retryReads=false&retryWrites=false&maxAdaptiveRetries=0")
        try:
            with pytest.raises(pymongo.errors.PyMongoError):
                await in_thread(lambda: client.test.c.find_one())
        finally:
            await in_thread(client.close)
    finds = up.commands("find")
    # waits of 100 then 200 ms: the second would cross the 250 ms deadline, so two attempts
    assert len(finds) == 2
    assert 0 < finds[0].body["maxTimeMS"] <= 250


async def test_a_router_that_went_away_is_routed_around() -> None:
    async with (
        MongoTestServer("mongos") as a,
        MongoTestServer("mongos") as b,
        sidecar(config([a.endpoint, b.endpoint])) as sc,
    ):
        client = sc.client()
        try:
            await in_thread(lambda: client.admin.command("ping"))
            await a.stop()  # gone between two heartbeats: the sidecar learns it from a refused connection
            for _ in range(5):
                await in_thread(lambda: client.test.c.find_one())
        finally:
            await in_thread(client.close)
        assert b.count("find") == 5
        (listener,) = sc.app.listeners
        assert not listener.up.topology.servers[a.endpoint].up
