"""Command facts, classification, the sidecar's own documents, pins and SCRAM: pure parts, no sockets."""

from __future__ import annotations

import uuid

import bson
import pytest
from bson.binary import Binary
from bson.raw_bson import RawBSONDocument

from sidecar.adapters.mongo import answer, wire
from sidecar.adapters.mongo.classify import Failure, classify_failure, classify_reply
from sidecar.adapters.mongo.commands import describe
from sidecar.adapters.mongo.pinning import Pins
from sidecar.adapters.mongo.scram import ScramClient, ScramFailure
from sidecar.policy import OutcomeClass as C
from sidecar.testing.mongo.scram import Conversation, Credential

LSID = {"id": Binary(uuid.UUID(int=7).bytes, 4)}


def cmd(doc: dict, sequences: dict[str, list[dict]] | None = None):
    sections = [(0, bson.encode({**doc, "$db": doc.get("$db", "test")}))]
    for ident, docs in (sequences or {}).items():
        sections.append((1, wire.encode_sequence(ident, [bson.encode(d) for d in docs])))
    m = wire.encode_msg(1, 0, 0, sections)
    return describe(wire.parse_msg(m[16:], wire.parse_header(m, 1 << 20)))[0]


def test_command_facts() -> None:
    c = cmd(
        {
            "find": "orders",
            "filter": {},
            "maxTimeMS": 250,
            "$readPreference": {"mode": "secondary", "tags": [{"dc": "a"}]},
        }
    )
    assert (c.name, c.db, c.collection, c.max_time_ms) == ("find", "test", "orders", 250)
    assert c.read_preference.mode == "secondary" and c.read_preference.tag_sets == ((("dc", "a"),),)
    assert c.retryable_read and not c.retryable_write and c.span_name() == "find orders"
    g = cmd({"getMore": bson.Int64(2**40), "collection": "orders"})
    assert g.cursor_ids == (2**40,) and g.collection == "orders" and not g.accepts_added_max_time
    tail = cmd({"getMore": bson.Int64(7), "collection": "orders", "maxTimeMS": 1000})
    assert tail.max_time_ms is None  # an awaitData wait, not a deadline: neither enforced nor rewritten


@pytest.mark.parametrize(
    ("doc", "seqs", "retryable"),
    [
        ({"insert": "c", "lsid": LSID, "txnNumber": 1}, {"documents": [{"a": 1}]}, True),
        ({"insert": "c"}, {"documents": [{"a": 1}]}, False),  # no txnNumber: the server cannot dedupe
        ({"update": "c", "lsid": LSID, "txnNumber": 1}, {"updates": [{"q": {}, "u": {}}]}, True),
        (
            {"update": "c", "lsid": LSID, "txnNumber": 1},
            {"updates": [{"q": {}, "u": {}, "multi": True}]},
            False,
        ),
        ({"delete": "c", "lsid": LSID, "txnNumber": 1, "deletes": [{"q": {}, "limit": 1}]}, None, True),
        ({"delete": "c", "lsid": LSID, "txnNumber": 1, "deletes": [{"q": {}, "limit": 0}]}, None, False),
        ({"insert": "c", "lsid": LSID, "txnNumber": 1, "autocommit": False}, {"documents": [{}]}, False),
    ],
)
def test_retryable_write_rules(doc: dict, seqs: dict | None, retryable: bool) -> None:
    assert cmd(doc, seqs).retryable_write is retryable


def test_aggregate_with_out_is_not_a_retryable_read() -> None:
    assert cmd({"aggregate": "c", "pipeline": [{"$match": {}}], "cursor": {}}).retryable_read
    assert not cmd({"aggregate": "c", "pipeline": [{"$out": "x"}], "cursor": {}}).retryable_read


def raw(doc: dict) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc))


OVERLOAD = {"ok": 0, "code": 462, "errorLabels": ["SystemOverloadedError", "RetryableError"]}


def test_classification() -> None:
    find = cmd({"find": "c"})
    generic = cmd({"dbStats": 1})
    write = cmd({"insert": "c", "lsid": LSID, "txnNumber": 3}, {"documents": [{}]})
    assert classify_reply(raw({"ok": 1}), find, False).cls is C.SUCCESS
    o = classify_reply(raw({**OVERLOAD, "baseBackoffMS": 250}), generic, False)
    assert o.cls is C.OVERLOADED and o.backoff_base == 0.25
    lone = classify_reply(raw({"ok": 0, "code": 2, "errorLabels": ["SystemOverloadedError"]}), find, False)
    assert lone.cls is C.FATAL and lone.overload  # not retried, but the server said it is overloaded
    assert not classify_reply(raw({"ok": 0, "code": 2}), find, False).overload
    assert (
        classify_reply(raw({"ok": 0, "code": 1, "errorLabels": ["RetryableError"]}), generic, False).cls
        is C.UNAVAILABLE
    )
    assert classify_reply(raw({"ok": 0, "code": 91}), find, False).cls is C.UNAVAILABLE  # retryable read code
    assert classify_reply(raw({"ok": 0, "code": 91}), generic, False).cls is C.FATAL
    assert classify_reply(raw({"ok": 0, "code": 10107}), generic, False).cls is C.UNAVAILABLE  # not primary
    wce = raw({"ok": 1, "writeConcernError": {"code": 91}, "errorLabels": ["RetryableWriteError"]})
    assert classify_reply(wce, write, False).cls is C.UNAVAILABLE
    nwp = classify_reply(raw({"ok": 0, "code": 91, "errorLabels": ["NoWritesPerformed"]}), write, False)
    assert nwp.prefer_previous
    expired = classify_reply(raw({"ok": 0, "code": 50}), find, True)
    assert expired.cls is C.TIMEOUT and expired.deadline_expired


def test_failures_without_a_reply() -> None:
    find, generic = cmd({"find": "c"}), cmd({"dbStats": 1})
    refused = classify_failure(Failure("connect", "refused"), generic)
    assert refused.cls is C.CONNECT_FAILURE and refused.overload  # as drivers label it
    assert classify_failure(Failure("network", "reset"), find).cls is C.RESET
    assert classify_failure(Failure("network", "reset"), generic).cls is C.FATAL  # it may have run
    assert classify_failure(Failure("auth", "bad password"), find).cls is C.FATAL


def test_retry_labels_are_stripped_and_others_kept() -> None:
    out = bson.decode(
        answer.without_retry_labels(
            raw(
                {
                    **OVERLOAD,
                    "errorLabels": ["SystemOverloadedError", "RetryableError", "RetryableWriteError"],
                }
            )
        )
    )
    assert out["errorLabels"] == ["SystemOverloadedError"] and out["code"] == 462
    assert answer.without_retry_labels(raw({"ok": 0, "errorLabels": ["TransientTransactionError"]})) is None


def test_the_sidecar_failure_documents() -> None:
    find = cmd({"find": "c"})
    doc = bson.decode(answer.failure_doc(Failure("connect", "refused"), find, "db", 6, keep=False))
    assert (
        doc["code"] == 133
        and doc["errorLabels"] == ["SystemOverloadedError"]
        and "6 attempts" in doc["errmsg"]
    )
    kept = bson.decode(answer.failure_doc(Failure("connect", "refused"), find, "db", 1, keep=True))
    assert kept["errorLabels"] == ["SystemOverloadedError", "RetryableError"]
    txn = cmd({"find": "c", "lsid": LSID, "txnNumber": 1, "autocommit": False})
    assert (
        "TransientTransactionError"
        in bson.decode(answer.failure_doc(Failure("network", "x"), txn, "db", 1, keep=False))["errorLabels"]
    )


def test_hello_reply_is_a_mongos_without_topology_version() -> None:
    facts = {
        "maxWireVersion": 17,
        "minWireVersion": 0,
        "logicalSessionTimeoutMinutes": 30,
        "maxBsonObjectSize": 1,
        "maxMessageSizeBytes": 2,
        "maxWriteBatchSize": 3,
    }
    h = bson.decode(answer.hello_reply({"hello": 1, "helloOk": True}, facts, 4))
    assert h["msg"] == "isdbgrid" and h["isWritablePrimary"] and h["helloOk"] and h["maxWireVersion"] == 17
    assert "topologyVersion" not in h
    assert bson.decode(answer.hello_reply({"isMaster": 1}, facts, 4))["ismaster"] is True


def test_pins_expire_and_are_bounded() -> None:
    pins = Pins(cursor_ttl=10, txn_ttl=10, limit=2)
    pins.cursor_opened(1, "a:1", now=0)
    pins.cursor_opened(2, "b:2", now=1)
    assert pins.cursor([2], now=5) == "b:2"
    pins.cursor_opened(3, "c:3", now=6)  # over the limit: the least recently used goes
    assert pins.cursor([1], now=6) is None and pins.cursor([3], now=6) == "c:3"
    assert pins.cursor([3], now=17) is None  # idle for more than the ttl
    pins.transaction_started(b"s", 4, "a:1", now=0)
    assert pins.transaction(b"s", 4, now=1) == "a:1" and pins.transaction(b"s", 5, now=1) is None
    pins.sessions_ended([b"s"])
    assert pins.transaction(b"s", 4, now=1) is None


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
def test_scram_client_against_the_test_server(mechanism: str) -> None:
    users = {"u": {mechanism: Credential.make(mechanism, "u", "pw")}}
    server = Conversation(mechanism, users)
    client = ScramClient(mechanism, "u", "pw")
    final = server.finish(client.final(server.start(client.first())))
    client.verify(final)
    wrong = ScramClient(mechanism, "u", "nope")
    server2 = Conversation(mechanism, users)
    with pytest.raises(Exception, match="Authentication failed"):
        server2.finish(wrong.final(server2.start(wrong.first())))
    with pytest.raises(ScramFailure):
        client.verify(b"v=" + b"AAAA")
