"""``mongodb+srv://`` (issue 23 point 1): the seed list from SRV and options from TXT, served by a real DNS
server (dnsmasq) through the sidecar's ``resolver:``; for routers, the record is read again at its TTL and
the routers added and removed follow it (Polling SRV Records for mongos Discovery)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sidecar.testing.dns_server import DnsServer
from sidecar.testing.mongo import MongoTestServer
from tests.metrics import until

from .conftest import config, in_thread, sidecar

NAME = "cluster0.test"
RECORD = f"_mongodb._tcp.{NAME}"


@pytest.fixture
async def dns() -> AsyncIterator[DnsServer]:
    names = {f"r{i}.{NAME}": ["127.0.0.1"] for i in (1, 2, 3)}
    async with DnsServer(names, ttl=1) as server:
        yield server


def srv_config(dns: DnsServer, uri: str, listener: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg = config([], upstream={"uri": uri}, listener=listener)
    del cfg["upstreams"]["db"]["endpoints"]
    cfg["resolver"] = {"nameservers": [dns.address], "timeout": "300ms"}
    return cfg


async def test_the_seed_list_from_srv_and_options_from_txt(dns: DnsServer) -> None:
    async with (
        MongoTestServer("mongos", users={"app": "app-password"}) as a,
        MongoTestServer("mongos", users={"app": "app-password"}) as b,
    ):
        await dns.set_srv([(RECORD, f"r1.{NAME}", a.port), (RECORD, f"r2.{NAME}", b.port)])
        await dns.set_txt({NAME: "authSource=admin"})
        uri = f"mongodb+srv://app:app-password@{NAME}/shop?tls=false"
        async with sidecar(srv_config(dns, uri)) as sc:
            listener = sc.app.listeners[0]
            assert sorted(listener.up.topology.members.seeds) == [
                f"r1.{NAME}:{a.port}",
                f"r2.{NAME}:{b.port}",
            ]
            assert listener.settings.auth.source == "admin"  # TXT's authSource (the URI's database is shop)
            assert all(s.up for s in listener.up.topology.servers.values())  # both reached by their names
            client = sc.client()
            try:
                for i in range(20):
                    await in_thread(lambda i=i: client.shop.items.insert_one({"i": i}))
            finally:
                await in_thread(client.close)
    assert a.count("insert") + b.count("insert") == 20
    assert {c.user for c in a.commands("insert") + b.commands("insert")} == {"app"}


async def test_a_txt_replica_set_applies(dns: DnsServer) -> None:
    async with MongoTestServer("primary", set_name="rs0") as p:
        seed = f"r1.{NAME}:{p.port}"
        p.hosts, p.primary = [seed], seed
        await dns.set_srv([(RECORD, f"r1.{NAME}", p.port)])
        await dns.set_txt({NAME: "replicaSet=other"})
        async with sidecar(srv_config(dns, f"mongodb+srv://{NAME}/?tls=false")) as sc:
            e = await sc.failure(lambda c: c.test.c.insert_one({"a": 1}))
        assert e.value.code == 133 and "replica set name 'rs0', expected 'other'" in str(e.value)
        await dns.set_txt({NAME: "replicaSet=rs0"})
        async with sidecar(srv_config(dns, f"mongodb+srv://{NAME}/?tls=false")) as sc:
            client = sc.client()
            try:
                await in_thread(lambda: client.test.c.insert_one({"a": 1}))
            finally:
                await in_thread(client.close)
    assert p.count("insert") == 1


async def test_routers_added_and_removed_in_the_srv_record_are_followed(dns: DnsServer) -> None:
    async with MongoTestServer("mongos") as a, MongoTestServer("mongos") as b:
        await dns.set_srv([(RECORD, f"r1.{NAME}", a.port)])
        cfg = srv_config(dns, f"mongodb+srv://{NAME}/?tls=false")
        async with sidecar(cfg, rand=random.Random(7).random) as sc:  # spread over the routers
            topology = sc.app.listeners[0].up.topology
            client = sc.client()
            try:
                await dns.set_srv([(RECORD, f"r1.{NAME}", a.port), (RECORD, f"r2.{NAME}", b.port)])
                r2 = f"r2.{NAME}:{b.port}"
                await until(lambda: r2 in topology.servers and topology.servers[r2].up, "r2 added and up")
                for i in range(20):
                    await in_thread(lambda i=i: client.test.c.insert_one({"i": i}))
                assert b.count("insert") > 0  # the router added takes commands
                await dns.set_srv([(RECORD, f"r2.{NAME}", b.port)])
                await until(lambda: f"r1.{NAME}:{a.port}" not in topology.servers, "r1 removed")
                before = a.count("insert")
                for i in range(10):
                    await in_thread(lambda i=i: client.test.c.insert_one({"j": i}))
                assert a.count("insert") == before  # the router removed takes none
            finally:
                await in_thread(client.close)


async def test_a_name_that_does_not_resolve_yet_is_looked_up_again(dns: DnsServer) -> None:
    async with MongoTestServer("mongos") as a:
        await dns.set_srv([])
        async with sidecar(srv_config(dns, f"mongodb+srv://{NAME}/?tls=false")) as sc:
            e = await sc.failure(lambda c: c.test.c.find_one())
            assert e.value.code == 133
            await dns.set_srv([(RECORD, f"r1.{NAME}", a.port)])
            topology = sc.app.listeners[0].up.topology
            r1 = f"r1.{NAME}:{a.port}"
            await until(lambda: r1 in topology.servers and topology.servers[r1].up, "r1 found and up")
            client = sc.client()
            try:
                await in_thread(lambda: client.test.c.insert_one({"a": 1}))
            finally:
                await in_thread(client.close)
    assert a.count("insert") == 1
