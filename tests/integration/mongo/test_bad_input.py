"""Bad input closes that one app connection, with a log line naming the problem; the rest keep working."""

from __future__ import annotations

import asyncio
import logging
import struct

import bson
import pytest

from sidecar.adapters.mongo import wire
from sidecar.testing.mongo import MongoTestServer
from tests.metrics import metric

from .conftest import OVERLOAD, config, in_thread, sidecar


def _msg(body: dict, request_id: int = 1, flags: int = 0) -> bytes:
    return wire.encode_body_msg(request_id, 0, bson.encode(body), flags)


BAD_MESSAGES = {
    "length below the header": struct.pack("<iiii", 5, 1, 0, wire.OP_MSG),
    "over the size limit": struct.pack("<iiii", 10_000_000, 1, 0, wire.OP_MSG),
    "unknown opcode": struct.pack("<iiii", 20, 1, 0, 9999) + b"\x00" * 4,
    "compressed": struct.pack("<iiii", 20, 1, 0, wire.OP_COMPRESSED) + b"\x00" * 4,
    "bad BSON length": struct.pack("<iiii", 26, 1, 0, wire.OP_MSG)
    + b"\x00\x00\x00\x00\x00"
    + struct.pack("<i", 900)
    + b"\x00",
    "unknown section kind": struct.pack("<iiii", 26, 1, 0, wire.OP_MSG)
    + b"\x00\x00\x00\x00\x07"
    + bson.encode({})[:5],
    "unknown required flag": _msg({"ping": 1, "$db": "admin"}, flags=1 << 4),
    "empty command": _msg({}),
    "invalid BSON in the body": wire.encode_body_msg(1, 0, b"\x0a\x00\x00\x00\x10a\x00\x01\x00\x00"),
    "no $db": _msg({"ping": 1}),
}


def _fix_checksum_case() -> None:
    # a message with the checksum flag whose checksum is wrong: rebuild its length to include the 4 bytes
    raw = _msg({"ping": 1, "$db": "admin"}, flags=wire.CHECKSUM_PRESENT) + b"\x00\x00\x00\x00"
    BAD_MESSAGES["bad checksum"] = struct.pack("<i", len(raw)) + raw[4:]


_fix_checksum_case()


async def _send_raw(host: str, port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 5)  # b"" once the sidecar closes the connection
    finally:
        writer.close()


@pytest.mark.parametrize("case", sorted(BAD_MESSAGES))
async def test_a_bad_message_closes_only_its_connection(case: str, caplog: pytest.LogCaptureFixture) -> None:
    async with (
        MongoTestServer("mongos") as up,
        sidecar(config([up.endpoint], listener={"max_message_size": "1MiB"})) as sc,
    ):
        client = sc.client()
        try:
            await in_thread(lambda: client.test.c.insert_one({"a": 1}))  # an app connection already open
            with caplog.at_level(logging.WARNING, logger="sidecar.mongo"):
                answer = await _send_raw(sc.host, sc.port, BAD_MESSAGES[case])
            assert answer == b""  # closed, nothing sent back
            assert await in_thread(lambda: client.test.c.count_documents({})) == 1
        finally:
            await in_thread(client.close)
    assert any("closing the connection" in r.getMessage() for r in caplog.records), caplog.text


async def test_an_oversized_insert_closes_the_connection_and_names_the_size(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with (
        MongoTestServer("mongos") as up,
        sidecar(config([up.endpoint], listener={"max_message_size": "64KiB"})) as sc,
    ):
        with caplog.at_level(logging.WARNING, logger="sidecar.mongo"):
            answer = await _send_raw(
                sc.host, sc.port, _msg({"insert": "c", "documents": [{"x": "y" * 100_000}], "$db": "t"})
            )
        assert answer == b""
        assert up.count("insert") == 0
    assert any("exceeds the limit of 65536 bytes" in r.getMessage() for r in caplog.records)


async def test_a_valid_checksummed_message_is_accepted_and_answered() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        msg = wire.encode_msg(9, 0, 0, [(0, bson.encode({"ping": 1, "$db": "admin"}))], checksum=True)
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        try:
            writer.write(msg)
            head = await reader.readexactly(16)
            header = wire.parse_header(head, 1 << 20)
            payload = await reader.readexactly(header.length - 16)
        finally:
            writer.close()
        assert header.response_to == 9
        assert bson.decode(wire.parse_msg(payload, header).body)["ok"] == 1.0
        assert up.count("ping") == 1


async def test_an_unacknowledged_write_gets_no_reply_and_reaches_the_upstream() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        client = sc.client("w=0&" + "retryReads=false&retryWrites=false&maxAdaptiveRetries=0")
        try:
            await in_thread(lambda: client.test.c.insert_one({"a": 1}))
            await up.wait_for(lambda s: s.count("insert") == 1)
        finally:
            await in_thread(client.close)
        assert up.commands("insert")[0].body["writeConcern"] == {"w": 0}


def _requests(sc, reason: str) -> float:  # noqa: ANN001
    return metric(sc.app, "sidecar_requests_total", reason=reason)


async def test_an_app_that_goes_away_mid_request_stops_the_retries() -> None:
    # j = 1: the retries would come 100, 200, 400 ms apart; the app leaves during the first wait
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint]), rand=lambda: 1.0) as sc:
        up.fail_command(["find"], **OVERLOAD)
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        writer.write(_msg({"find": "c", "filter": {}, "$db": "t"}))
        await up.wait_for(lambda s: s.count("find") == 1)
        writer.close()
        async with asyncio.timeout(5):
            while _requests(sc, "cancelled") < 1:
                await asyncio.sleep(0.01)
        assert up.count("find") == 1  # the request is over: no attempt will follow


def _op_query(doc: bytes, request_id: int = 5) -> bytes:
    body = struct.pack("<i", 0) + b"admin.$cmd\x00" + struct.pack("<ii", 0, -1) + doc
    return struct.pack("<iiii", 16 + len(body), request_id, 0, wire.OP_QUERY) + body


async def test_an_op_query_with_bad_bson_gets_an_error_and_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = b"\x0b\x00\x00\x00\x02a\x00\xff\xff\xff\x00"  # a string whose length runs past the document
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        reader, writer = await asyncio.open_connection(sc.host, sc.port)
        try:
            with caplog.at_level(logging.WARNING):
                replies = []
                for request_id, doc in ((5, bad), (6, bson.encode({"isMaster": 1}))):
                    writer.write(_op_query(doc, request_id))
                    head = await asyncio.wait_for(reader.readexactly(16), 10)
                    length, _, response_to, op = struct.unpack("<iiii", head)
                    assert (response_to, op) == (request_id, wire.OP_REPLY)
                    reply = wire.parse_reply(await reader.readexactly(length - 16))
                    replies.append(bson.decode(reply.documents[0]))
        finally:
            writer.close()
    assert replies[0]["ok"] == 0 and replies[0]["code"] == 22, replies[0]
    assert replies[1]["ok"] == 1 and replies[1]["ismaster"] is True  # the connection goes on
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("sidecar")]
    assert len(lines) == 1 and "not valid BSON" in lines[0].getMessage(), caplog.text
    assert not any(r.exc_info for r in caplog.records)
