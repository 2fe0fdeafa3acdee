"""The MongoDB listener's timers: idle connections are closed, a message begun must be complete within
``message_timeout``, and a command in progress is never cut for idleness."""

from __future__ import annotations

import asyncio
import logging
import struct

import pytest

from sidecar.adapters.mongo import wire
from sidecar.testing.mongo import MongoTestServer

from .conftest import config, in_thread, sidecar


async def closed_within(reader: asyncio.StreamReader, bound: float = 10.0) -> bytes:
    """What arrives until the sidecar closes the connection (generous bound: the machine is shared)."""
    async with asyncio.timeout(bound):
        return await reader.read()


async def test_an_idle_connection_is_closed() -> None:
    async with (
        MongoTestServer("mongos") as up,
        sidecar(config([up.endpoint], listener={"idle_timeout": "200ms"})) as sc,
    ):
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        try:
            assert await closed_within(reader) == b""
        finally:
            writer.close()
        listener = sc.app.listeners[0]
        async with asyncio.timeout(10):
            while listener._connections:  # noqa: SLF001 - the listener forgets it too
                await asyncio.sleep(0.01)


async def test_a_stalled_message_is_cut_with_a_log_line_naming_the_peer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with (
        MongoTestServer("mongos") as up,
        sidecar(config([up.endpoint], listener={"message_timeout": "300ms"})) as sc,
    ):
        client = sc.client()
        try:
            await in_thread(lambda: client.test.c.insert_one({"a": 1}))
            reader, writer = await asyncio.open_connection(sc.host, sc.port)
            local_host, local_port = writer.get_extra_info("sockname")[:2]
            peer = f"{local_host}:{local_port}"
            with caplog.at_level(logging.WARNING, logger="sidecar.mongo"):
                writer.write(struct.pack("<iiii", 100, 1, 0, wire.OP_MSG) + b"\x00" * 4)  # 20 of 100 bytes
                await writer.drain()
                try:
                    assert await closed_within(reader) == b""
                finally:
                    writer.close()
            # the good client's connection, idle meanwhile, is untouched
            assert await in_thread(lambda: client.test.c.count_documents({})) == 1
        finally:
            await in_thread(client.close)
    lines = [r.getMessage() for r in caplog.records if "message_timeout" in r.getMessage()]
    assert len(lines) == 1 and peer in lines[0] and "20 of 100 bytes" in lines[0], caplog.text


async def test_a_slow_command_is_not_idle() -> None:
    async with (
        MongoTestServer("mongos") as up,
        sidecar(
            config([up.endpoint], policy={"per_try_timeout": "none"}, listener={"idle_timeout": "300ms"})
        ) as sc,
    ):
        writer = sc.client()
        try:
            await in_thread(lambda: writer.test.c.insert_one({"a": 1}))
        finally:
            await in_thread(writer.close)
        # a fresh client: its connection's hello is followed at once by the find (not idle in between)
        up.fail_command(["find"], times=1, block_connection=True, block_time_ms=1500)
        client = sc.client()
        try:
            assert (await in_thread(lambda: client.test.c.find_one({})))["a"] == 1
        finally:
            await in_thread(client.close)


@pytest.mark.parametrize(("key", "value"), [("idle_timeout", "0s"), ("message_timeout", "0s")])
def test_timeouts_must_be_positive(key: str, value: str) -> None:
    from sidecar.config import ConfigError, load_dict

    with pytest.raises(ConfigError) as e:
        load_dict(config(["127.0.0.1:1"], listener={key: value}), {})
    assert f"listeners[0].{key}" in str(e.value.render())


async def test_idle_upstream_connections_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst opens several upstream connections; once idle past the pool's idle time they are closed."""
    from sidecar.adapters.mongo import server as mongo_server

    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        clients = [sc.client() for _ in range(4)]
        try:
            up.fail_command(["find"], times=4, block_connection=True, block_time_ms=300)
            await asyncio.gather(*(in_thread(lambda c=c: c.test.c.find_one({})) for c in clients))
            pool = sc.app.listeners[0].up.logins.own.get(up.endpoint)
            assert len(pool.idle) >= 2  # the burst needed more than one
            monkeypatch.setattr(mongo_server, "POOL_IDLE_TIMEOUT", 0.05)
            async with asyncio.timeout(10):
                while pool.idle:
                    await asyncio.sleep(0.02)
        finally:
            for c in clients:
                await in_thread(c.close)
