"""The wire codec: back-to-back encode/parse, and every malformation refused with a reason."""

from __future__ import annotations

import struct

import bson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.adapters.mongo import wire
from sidecar.adapters.mongo.patch import PatchError, find_field, set_number


def _parse(message: bytes) -> wire.Msg:
    header = wire.parse_header(message, 1 << 20)
    return wire.parse_msg(message[16:], header)


def test_body_and_document_sequences_round_trip() -> None:
    body = bson.encode({"insert": "c", "$db": "t"})
    docs = [bson.encode({"_id": i}) for i in range(3)]
    msg = wire.encode_msg(5, 0, wire.MORE_TO_COME, [(0, body), (1, wire.encode_sequence("documents", docs))])
    parsed = _parse(msg)
    assert parsed.body == body and parsed.more_to_come
    assert [s.identifier for s in parsed.sequences] == ["documents"]
    assert parsed.sequences[0].documents() == docs
    # forwarding keeps the sections byte for byte
    assert wire.encode_msg(5, 0, parsed.flags, parsed.sections) == msg


def test_checksum_is_written_and_verified() -> None:
    msg = wire.encode_msg(1, 0, 0, [(0, bson.encode({"ping": 1}))], checksum=True)
    assert _parse(msg).flags & wire.CHECKSUM_PRESENT
    broken = msg[:-1] + bytes([msg[-1] ^ 1])
    with pytest.raises(wire.ProtocolError, match="checksum"):
        _parse(broken)


def test_crc32c_known_answer() -> None:
    assert wire.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\x00\x00", "too short"),
        (b"\x00\x00\x00\x00", "too short"),
        (struct.pack("<I", 1 << 5) + b"\x00" + bson.encode({}), "required flag bits"),
        (b"\x00\x00\x00\x00\x02" + bson.encode({}), "section kind 2"),
        (b"\x00\x00\x00\x00\x00" + struct.pack("<i", 50) + b"\x00", "does not fit"),
        (b"\x00\x00\x00\x00\x00" + b"\x05\x00\x00\x00\x01", "not terminated"),
        (b"\x00\x00\x00\x00\x00" + bson.encode({}) + b"\x00" + bson.encode({}), "more than one body"),
        (b"\x00\x00\x00\x00\x01" + struct.pack("<i", 9) + b"docs\x00", "no body section"),
        (b"\x00\x00\x00\x00\x01" + struct.pack("<i", 99) + b"docs\x00", "does not fit"),
    ],
)
def test_malformed_op_msg_is_refused_with_a_reason(payload: bytes, reason: str) -> None:
    header = wire.Header(16 + len(payload), 1, 0, wire.OP_MSG)
    with pytest.raises(wire.ProtocolError, match=reason):
        wire.parse_msg(payload, header)


def test_header_limits() -> None:
    with pytest.raises(wire.ProtocolError, match="smaller than the 16-byte header"):
        wire.parse_header(struct.pack("<iiii", 3, 0, 0, wire.OP_MSG), 100)
    with pytest.raises(wire.ProtocolError, match="exceeds the limit of 100 bytes"):
        wire.parse_header(struct.pack("<iiii", 101, 0, 0, wire.OP_MSG), 100)


def test_op_query_and_op_reply_round_trip() -> None:
    q = wire.encode_query(3, "admin.$cmd", bson.encode({"isMaster": 1}))
    header = wire.parse_header(q, 1 << 20)
    query = wire.parse_query(q[16:])
    assert header.op_code == wire.OP_QUERY and query.collection == "admin.$cmd"
    r = wire.encode_reply(4, 3, [bson.encode({"ok": 1})])
    reply = wire.parse_reply(r[16:])
    assert wire.parse_header(r, 1 << 20).response_to == 3 and bson.decode(reply.documents[0]) == {"ok": 1}


def test_with_response_to_readdresses_a_reply() -> None:
    m = wire.encode_body_msg(10, 20, bson.encode({"ok": 1}))
    h = wire.parse_header(wire.with_response_to(m, 77), 1 << 20)
    assert h.response_to == 77 and h.length == len(m)


# -- maxTimeMS patching ------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [5, bson.Int64(5), 5.0])
def test_max_time_is_rewritten_in_place_keeping_its_type(value: object) -> None:
    doc = bson.encode({"find": "c", "filter": {"maxTimeMS": 1}, "maxTimeMS": value, "$db": "t"})
    out = set_number(doc, "maxTimeMS", 3)
    assert len(out) == len(doc)
    decoded = bson.decode(out)
    assert decoded["maxTimeMS"] == 3 and type(decoded["maxTimeMS"]) is type(bson.decode(doc)["maxTimeMS"])
    assert decoded["filter"] == {"maxTimeMS": 1}  # nested fields of the same name are untouched


def test_max_time_is_appended_when_absent() -> None:
    doc = bson.encode({"find": "c", "$db": "t"})
    assert bson.decode(set_number(doc, "maxTimeMS", 250)) == {"find": "c", "$db": "t", "maxTimeMS": 250}


def test_patching_refuses_a_non_number_and_a_broken_document() -> None:
    with pytest.raises(PatchError):
        set_number(bson.encode({"maxTimeMS": "soon"}), "maxTimeMS", 1)
    with pytest.raises(PatchError):
        find_field(b"\x0a\x00\x00\x00\x10a\x00\x01\x00\x00", b"maxTimeMS")


KEYS = st.text(st.characters(codec="utf-8", blacklist_characters="\x00"), max_size=8)  # a key is a C string
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(KEYS, children, max_size=3),
    max_leaves=10,
)


@settings(  # the same examples every run, no deadline: a loaded machine must not fail it
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.dictionaries(KEYS.filter(lambda k: k != "maxTimeMS"), values, max_size=6))
def test_patching_any_document_only_changes_max_time(doc: dict) -> None:
    raw = bson.encode(doc)
    out = bson.decode(set_number(raw, "maxTimeMS", 42))
    assert out.pop("maxTimeMS") == 42
    assert out == bson.decode(raw)


def test_the_compressor_ids_are_pymongos() -> None:
    """compression.py names the Wire Compression spec's ids itself (importing pymongo's module loads the whole
    driver, issue 27): they are the ones pymongo's contexts use."""
    from pymongo.compression_support import SnappyContext, ZlibContext, ZstdContext

    from sidecar.adapters.mongo import compression

    assert {
        "snappy": SnappyContext.compressor_id,
        "zlib": ZlibContext.compressor_id,
        "zstd": ZstdContext.compressor_id,
    } == compression.IDS
