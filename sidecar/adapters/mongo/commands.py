"""What a command is, read from its body: name, namespace, session and transaction, read preference,
cursor ids, its deadline, and which retry rules apply. Pure: documents in, facts out.

The rules are the drivers' (Retryable Reads, Retryable Writes, Client Backpressure):
* a *retryable read* is find, aggregate without ``$out``/``$merge``, distinct, count, listCollections,
  listIndexes, listDatabases; it may be retried after a network error or a retryable error code;
* a *retryable write* is insert, update and delete whose statements each touch one document, findAndModify,
  bulkWrite without multi-document operations, sent with ``lsid`` + ``txnNumber`` outside a transaction
  (the server deduplicates by them); it may be retried after a network error or ``RetryableWriteError``;
* any command may be retried on an error labelled ``RetryableError`` (Client Backpressure);
* statements inside a transaction are never retried one by one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bson import CodecOptions
from bson.raw_bson import RawBSONDocument

from .wire import Msg, split_documents

RAW = CodecOptions(document_class=RawBSONDocument)

HELLO = frozenset({"hello", "isMaster", "ismaster"})
AUTH = frozenset({"saslStart", "saslContinue", "authenticate", "getnonce", "logout"})
READS = frozenset(
    {"find", "aggregate", "distinct", "count", "listCollections", "listIndexes", "listDatabases"}
)
#: Reads in the sense of execution control (issue 12: which ticket pool an attempt uses); aggregate only without
#: ``$out``/``$merge``. Everything else takes a write ticket.
TICKET_READS = frozenset(
    {"find", "aggregate", "count", "distinct", "getMore", "listCollections", "listIndexes"}
)
_WRITES = frozenset({"insert", "update", "delete", "findAndModify", "bulkWrite"})
_TXN_END = frozenset({"commitTransaction", "abortTransaction"})
#: commands whose first value names a collection
_COLLECTION_FIRST = READS | _WRITES | frozenset({"create", "drop", "createIndexes", "dropIndexes", "collMod"})
#: commands that never take ``maxTimeMS`` from the sidecar's own deadline (it may still rewrite one sent)
_NO_ADDED_MAXTIME = HELLO | AUTH | frozenset({"getMore", "killCursors", "endSessions", "ping"})
PRIMARY = "primary"
_MODES = frozenset({"primary", "primaryPreferred", "secondary", "secondaryPreferred", "nearest"})


@dataclass(frozen=True, slots=True)
class ReadPreference:
    mode: str = PRIMARY
    tag_sets: tuple[tuple[tuple[str, str], ...], ...] = ()

    @property
    def primary_only(self) -> bool:
        return self.mode == PRIMARY

    def describe(self) -> str:
        if not self.tag_sets:
            return f"{{mode: {self.mode}}}"
        return f"{{mode: {self.mode}, tags: {[dict(t) for t in self.tag_sets]}}}"


PRIMARY_PREF = ReadPreference()


@dataclass(frozen=True, slots=True)
class Command:
    """The facts about one command that routing and retrying need."""

    name: str
    db: str
    collection: str | None
    max_time_ms: int | None  # as sent by the app (None: absent or 0, i.e. no limit)
    lsid: bytes | None  # the raw ``lsid`` document: the session's identity
    txn_number: int | None
    start_transaction: bool
    in_transaction: bool  # ``autocommit: false``: a statement of a multi-document transaction
    read_preference: ReadPreference
    cursor_ids: tuple[int, ...]  # getMore / killCursors
    retryable_read: bool
    retryable_write: bool
    reads_only: bool = False  # a read for execution control (TICKET_READS)

    @property
    def accepts_added_max_time(self) -> bool:
        return self.name not in _NO_ADDED_MAXTIME and not self.in_transaction

    @property
    def operation(self) -> str:
        return self.name

    def span_name(self) -> str:
        return f"{self.name} {self.collection}" if self.collection else self.name


class CommandError(ValueError):
    """The command cannot be read (not a BSON document, no name)."""


def describe(msg: Msg) -> tuple[Command, RawBSONDocument]:
    """The command an OP_MSG carries, and its body as a lazily decoded document."""
    try:
        body = RawBSONDocument(msg.body, RAW)
        name = next(iter(body), None)
    except Exception as e:  # bson raises several types for malformed input
        raise CommandError(f"the command body is not a valid BSON document: {e}") from None
    if name is None:
        raise CommandError("the command body is an empty document: no command name")
    try:
        return _describe(name, body, msg), body
    except CommandError:
        raise
    except Exception as e:
        raise CommandError(f"the {name!r} command could not be read: {e}") from None


def _describe(name: str, raw: RawBSONDocument, msg: Msg) -> Command:
    body = dict(raw.items())  # one pass over the top level; nested documents stay raw
    db = body.get("$db")
    if not isinstance(db, str) or not db:
        raise CommandError(f"the {name!r} command has no $db")
    first = body[name]
    collection = first if name in _COLLECTION_FIRST and isinstance(first, str) else None
    if name == "getMore":
        c = body.get("collection")
        collection = c if isinstance(c, str) else None
    lsid_doc = body.get("lsid")
    lsid = lsid_doc.raw if isinstance(lsid_doc, RawBSONDocument) else None
    txn = body.get("txnNumber")
    txn_number = int(txn) if isinstance(txn, int) and not isinstance(txn, bool) else None
    in_txn = body.get("autocommit") is False
    start_txn = body.get("startTransaction") is True
    cursor_ids: tuple[int, ...] = ()
    if name == "getMore" and isinstance(first, int):
        cursor_ids = (int(first),)
    elif name == "killCursors":
        ids = body.get("cursors")
        if isinstance(ids, list):
            cursor_ids = tuple(int(i) for i in ids if isinstance(i, int))
    mt = body.get("maxTimeMS")
    max_time = int(mt) if isinstance(mt, int | float) and not isinstance(mt, bool) and mt > 0 else None
    if name == "getMore":
        max_time = None  # on getMore it is how long an awaitData cursor waits for data, not a deadline
    rp = read_preference(body.get("$readPreference"))
    retryable_read = not in_txn and _is_retryable_read(name, body)
    reads_only = name in TICKET_READS and not (name == "aggregate" and _aggregate_writes(body))
    retryable_write = (
        lsid is not None and txn_number is not None and not in_txn and _is_retryable_write(name, body, msg)
    )
    return Command(
        name=name,
        db=db,
        collection=collection,
        max_time_ms=max_time,
        lsid=lsid,
        txn_number=txn_number,
        start_transaction=start_txn,
        in_transaction=in_txn,
        read_preference=rp,
        cursor_ids=cursor_ids,
        retryable_read=retryable_read,
        retryable_write=retryable_write,
        reads_only=reads_only,
    )


def read_preference(doc: Any) -> ReadPreference:
    if not isinstance(doc, Mapping):
        return PRIMARY_PREF
    mode = doc.get("mode")
    if mode not in _MODES:
        return PRIMARY_PREF
    tags: list[tuple[tuple[str, str], ...]] = []
    raw_tags = doc.get("tags")
    if isinstance(raw_tags, list):
        for t in raw_tags:
            if isinstance(t, Mapping):
                tags.append(tuple(sorted((str(k), str(v)) for k, v in t.items())))
    return ReadPreference(mode, tuple(tags))


def _is_retryable_read(name: str, body: Mapping[str, Any]) -> bool:
    if name not in READS:
        return False
    if name == "aggregate":
        return not _aggregate_writes(body)
    return True


def _aggregate_writes(body: Mapping[str, Any]) -> bool:
    pipeline = body.get("pipeline")
    if not isinstance(pipeline, list):
        return False
    return any(isinstance(stage, Mapping) and ("$out" in stage or "$merge" in stage) for stage in pipeline)


def _statements(body: Mapping[str, Any], msg: Msg, field: str) -> list[Mapping[str, Any]]:
    for seq in msg.sequences:
        if seq.identifier == field:
            return [RawBSONDocument(d, RAW) for d in split_documents(seq.raw)]
    value = body.get(field)
    return [s for s in value if isinstance(s, Mapping)] if isinstance(value, list) else []


def _is_retryable_write(name: str, body: Mapping[str, Any], msg: Msg) -> bool:
    if name in ("insert", "findAndModify"):
        return True
    if name == "update":
        return not any(s.get("multi") is True for s in _statements(body, msg, "updates"))
    if name == "delete":
        return all(s.get("limit") == 1 for s in _statements(body, msg, "deletes"))
    if name == "bulkWrite":
        ops = _statements(body, msg, "ops")
        return not any(op.get("multi") is True for op in ops)
    return False
