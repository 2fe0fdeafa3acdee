"""OP_COMPRESSED (issue 23 point 4): zlib, snappy and zstd on the app side (the listener's ``compressors``)
and on the upstream side (the URI's ``compressors``), each negotiated on its own; a reply to a compressed
request compressed with the same compressor; the handshake and logins never compressed; a compressed
message that would inflate past ``max_message_size`` refused without being inflated. The test server
decompresses and records the compressor of every command it receives."""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

import bson
import pytest

from sidecar.adapters.mongo import compression, wire
from sidecar.testing.mongo import MongoTestServer

from .conftest import NO_DRIVER_RETRIES, config, in_thread, sidecar

COMPRESSORS = ["zstd", "snappy", "zlib"]


def uri_config(uri: str, listener: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg = config([], upstream={"uri": uri}, listener=listener)
    del cfg["upstreams"]["db"]["endpoints"]
    return cfg


async def roundtrip(port: int, message: bytes) -> tuple[wire.Header, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(message)
        head = await reader.readexactly(16)
        header = wire.parse_header(head, 1 << 30)
        return header, await reader.readexactly(header.length - 16)
    finally:
        writer.close()


def op_msg(doc: dict[str, Any], request_id: int = 7) -> bytes:
    return wire.encode_body_msg(request_id, 0, bson.encode(doc))


@pytest.mark.parametrize("compressor", COMPRESSORS)
async def test_each_compressor_on_the_upstream_side(compressor: str) -> None:
    async with MongoTestServer("mongos") as up:
        cfg = uri_config(f"mongodb://{up.endpoint}/?compressors={compressor}")
        async with sidecar(cfg) as sc:
            client = sc.client()
            try:
                await in_thread(lambda: client.test.c.insert_one({"a": "x" * 1000}))
                assert (await in_thread(lambda: client.test.c.find_one()))["a"] == "x" * 1000
            finally:
                await in_thread(client.close)
    assert [c.compressor for c in up.commands() if c.name in ("insert", "find")] == [compressor, compressor]
    assert {c.compressor for c in up.commands(include_hello=True) if c.name == "hello"} == {None}


@pytest.mark.parametrize("compressor", COMPRESSORS)
async def test_each_compressor_on_the_app_side_and_the_reply_compressed_alike(compressor: str) -> None:
    async with MongoTestServer("mongos") as up:
        cfg = config([up.endpoint], listener={"compressors": COMPRESSORS})
        async with sidecar(cfg) as sc:
            hello = await roundtrip(
                sc.port, op_msg({"hello": 1, "compression": [compressor, "noop"], "$db": "admin"})
            )
            agreed = bson.decode(wire.parse_msg(hello[1], hello[0]).body)["compression"]
            assert agreed == [compressor] and hello[0].op_code == wire.OP_MSG  # hello: never compressed
            packed = compression.wrap(
                op_msg({"insert": "c", "documents": [{"a": 1}], "$db": "test"}), compressor
            )
            header, payload = await roundtrip(sc.port, packed)
            assert header.op_code == wire.OP_COMPRESSED and header.response_to == 7
            inner, body, used = compression.unwrap(header, payload, 1 << 24, compression.ALL)
            assert used == compressor and bson.decode(wire.parse_msg(body, inner).body)["n"] == 1
            # and pymongo, compressing with it, gets the same answers as uncompressed
            client = sc.client(f"{NO_DRIVER_RETRIES}&compressors={compressor}")
            try:
                assert await in_thread(lambda: client.test.c.count_documents({})) == 1
            finally:
                await in_thread(client.close)
    assert [c.compressor for c in up.commands("insert")] == [None]  # the upstream side: not negotiated


async def test_a_compressed_app_and_an_uncompressed_upstream_and_the_reverse() -> None:
    async with MongoTestServer("mongos") as up:
        cfg = uri_config(f"mongodb://{up.endpoint}/?compressors=zlib", {"compressors": ["snappy"]})
        async with sidecar(cfg) as sc:
            for options in ("compressors=snappy", ""):
                client = sc.client(f"{NO_DRIVER_RETRIES}&{options}" if options else NO_DRIVER_RETRIES)
                try:
                    await in_thread(lambda c=client, o=options: c.test.c.insert_one({"o": o}))
                finally:
                    await in_thread(client.close)
    assert [c.compressor for c in up.commands("insert")] == ["zlib", "zlib"]
    async with MongoTestServer("mongos", compressors=()) as up:  # an upstream that offers none
        cfg = uri_config(f"mongodb://{up.endpoint}/?compressors=zlib", {"compressors": ["zlib"]})
        async with sidecar(cfg) as sc:
            client = sc.client(f"{NO_DRIVER_RETRIES}&compressors=zlib")
            try:
                await in_thread(lambda: client.test.c.insert_one({"b": 1}))
            finally:
                await in_thread(client.close)
    assert [c.compressor for c in up.commands("insert")] == [None]


async def test_the_upstream_login_is_never_compressed() -> None:
    async with MongoTestServer("mongos", users={"app": "app-password"}) as up:
        cfg = uri_config(f"mongodb://app:app-password@{up.endpoint}/?compressors=zstd")
        async with sidecar(cfg) as sc:
            client = sc.client()
            try:
                await in_thread(lambda: client.test.c.insert_one({"a": 1}))
            finally:
                await in_thread(client.close)
    sasl = [c for c in up.commands() if c.name in ("saslStart", "saslContinue")]
    assert sasl and {c.compressor for c in sasl} == {None}
    assert [(c.compressor, c.user) for c in up.commands("insert")] == [("zstd", "app")]


async def test_a_compression_bomb_is_refused_without_inflating_it(caplog: pytest.LogCaptureFixture) -> None:
    async with MongoTestServer("mongos") as up:
        listener = {"compressors": ["zlib"], "max_message_size": "1MiB"}
        async with sidecar(config([up.endpoint], listener=listener)) as sc:
            inner = op_msg({"insert": "c", "documents": [{"pad": "x" * (4 << 20)}], "$db": "test"})
            packed = compression.wrap(inner, "zlib")
            assert len(packed) < 64 << 10  # 4 MiB of x: a few KiB on the wire, under the limit
            liar = bytearray(packed)
            struct.pack_into("<i", liar, 20, 1000)  # declares 1000 bytes, inflates to 4 MiB
            for bomb, said in [(packed, "would inflate to"), (bytes(liar), "does not inflate")]:
                with caplog.at_level(logging.WARNING):
                    reader, writer = await asyncio.open_connection(sc.host, sc.port)
                    writer.write(bomb)
                    assert await reader.read() == b""  # closed, unanswered
                    writer.close()
                assert said in caplog.text
            client = sc.client()  # other connections keep working
            try:
                assert (await in_thread(lambda: client.admin.command("ping")))["ok"] == 1
            finally:
                await in_thread(client.close)
    assert up.count("insert") == 0
