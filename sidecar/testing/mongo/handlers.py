"""What the test server does with each command: CRUD on in-memory collections, int64 cursors, retryable-write
deduplication by (lsid, txnNumber), transactions enough to pin, sessions. Replies are plain dicts."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

import bson
from bson.int64 import Int64

from .storage import Storage, apply_update, matches

Doc = dict[str, Any]

NOT_PRIMARY = 10107
NO_SECONDARY_OK = 13435
CURSOR_NOT_FOUND = 43
NO_SUCH_TRANSACTION = 251
COMMAND_NOT_FOUND = 59
DUPLICATE_KEY = 11000

READ_COMMANDS = frozenset({"find", "getMore", "count", "aggregate", "distinct", "listCollections"})
WRITE_COMMANDS = frozenset({"insert", "update", "delete", "findAndModify", "create", "drop"})


def error(code: int, name: str, msg: str, labels: list[str] | None = None) -> Doc:
    doc: Doc = {"ok": 0.0, "errmsg": msg, "code": code, "codeName": name}
    if labels:
        doc["errorLabels"] = labels
    return doc


class Handlers:
    def __init__(self, storage: Storage, rng: random.Random | None = None) -> None:
        self.storage = storage
        self.rng = rng or random.Random(5)
        self.cursors: dict[int, tuple[str, list[Doc]]] = {}  # id -> (namespace, remaining documents)
        self.retried: dict[tuple[bytes, int], Doc] = {}  # (lsid, txnNumber) -> the reply given
        self.transactions: dict[bytes, int] = {}  # lsid -> txnNumber of the open transaction
        self.ended_sessions: list[Any] = []
        self.applied_writes = 0  # writes actually applied (deduplicated retries do not count)
        self._table: dict[str, Callable[[Doc, list[Doc]], Doc]] = {
            "find": self.find,
            "getMore": self.get_more,
            "killCursors": self.kill_cursors,
            "insert": self.insert,
            "update": self.update,
            "delete": self.delete,
            "count": self.count,
            "aggregate": self.aggregate,
            "distinct": self.distinct,
            "drop": self.drop,
            "create": lambda cmd, docs: {"ok": 1.0},
            "listDatabases": self.list_databases,
            "listCollections": self.list_collections,
            "endSessions": self.end_sessions,
            "commitTransaction": self.end_transaction,
            "abortTransaction": self.end_transaction,
            "ping": lambda cmd, docs: {"ok": 1.0},
            "buildInfo": lambda cmd, docs: {
                "version": "7.0.0-test",
                "versionArray": [7, 0, 0, 0],
                "maxBsonObjectSize": 16 * 1024 * 1024,
                "ok": 1.0,
            },
            "buildinfo": lambda cmd, docs: {"version": "7.0.0-test", "versionArray": [7, 0, 0, 0], "ok": 1.0},
        }

    def known(self, name: str) -> bool:
        return name in self._table

    def run(self, name: str, cmd: Doc, sequences: dict[str, list[Doc]]) -> Doc:
        handler = self._table.get(name)
        if handler is None:
            return error(COMMAND_NOT_FOUND, "CommandNotFound", f"no such command: '{name}'")
        txn_error = self._transaction(cmd)
        if txn_error is not None:
            return txn_error
        key = self._retry_key(name, cmd)
        if key is not None and key in self.retried:
            return self.retried[key]  # a retried write: the same answer, applied once
        try:
            reply = handler(cmd, sequences)
        except (ValueError, TypeError, KeyError) as e:
            return error(2, "BadValue", str(e))
        if key is not None and reply.get("ok") == 1.0:
            self.retried[key] = reply
        return reply

    # -- sessions and transactions ---------------------------------------------------------------------
    @staticmethod
    def _lsid(cmd: Doc) -> bytes | None:
        lsid = cmd.get("lsid")
        return bson.encode(lsid) if isinstance(lsid, Mapping) else None

    def _retry_key(self, name: str, cmd: Doc) -> tuple[bytes, int] | None:
        if name not in ("insert", "update", "delete", "findAndModify") or cmd.get("autocommit") is False:
            return None
        lsid = self._lsid(cmd)
        txn = cmd.get("txnNumber")
        return (lsid, int(txn)) if lsid is not None and txn is not None else None

    def _transaction(self, cmd: Doc) -> Doc | None:
        if cmd.get("autocommit") is not False:
            return None
        lsid = self._lsid(cmd)
        txn = int(cmd.get("txnNumber", -1))
        if lsid is None:
            return error(50768, "InvalidOptions", "transactions need a session (lsid)")
        if cmd.get("startTransaction") is True:
            self.transactions[lsid] = txn
            return None
        if self.transactions.get(lsid) != txn:
            return error(
                NO_SUCH_TRANSACTION,
                "NoSuchTransaction",
                f"Transaction {txn} has been aborted or was not started on this server",
                ["TransientTransactionError"],
            )
        return None

    def end_transaction(self, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        lsid = self._lsid(cmd)
        if lsid is not None:
            self.transactions.pop(lsid, None)
        return {"ok": 1.0}

    def end_sessions(self, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        self.ended_sessions.extend(cmd.get("endSessions") or [])
        return {"ok": 1.0}

    # -- reads -----------------------------------------------------------------------------------------
    def _batch(self, ns: str, docs: list[Doc], batch_size: int | None, single: bool, first: bool) -> Doc:
        n = len(docs) if not batch_size or batch_size <= 0 else batch_size
        batch, rest = docs[:n], docs[n:]
        cursor_id = 0
        if rest and not single:
            # int64 ids well beyond int32, as real servers use
            cursor_id = self.rng.randrange(2**40, 2**62)
            self.cursors[cursor_id] = (ns, rest)
        key = "firstBatch" if first else "nextBatch"
        return {"cursor": {key: batch, "id": Int64(cursor_id), "ns": ns}, "ok": 1.0}

    def find(self, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        db, name = cmd["$db"], cmd["find"]
        docs = self.storage.collection(db, name).find(cmd.get("filter"))
        sort = cmd.get("sort")
        if sort:
            for key, direction in reversed(list(sort.items())):
                docs.sort(key=lambda d, k=key: (d.get(k) is None, d.get(k)), reverse=direction < 0)
        skip = int(cmd.get("skip", 0) or 0)
        limit = int(cmd.get("limit", 0) or 0)
        docs = docs[skip:]
        if limit:
            docs = docs[: abs(limit)]
        single = bool(cmd.get("singleBatch")) or limit < 0
        return self._batch(f"{db}.{name}", docs, cmd.get("batchSize"), single, True)

    def get_more(self, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        cid = int(cmd["getMore"])
        entry = self.cursors.pop(cid, None)
        if entry is None:
            return error(CURSOR_NOT_FOUND, "CursorNotFound", f"cursor id {cid} not found")
        ns, rest = entry
        reply = self._batch(ns, rest, cmd.get("batchSize"), False, False)
        if reply["cursor"]["id"]:
            # keep the same id for the rest, as servers do
            new_id = int(reply["cursor"]["id"])
            self.cursors[cid] = self.cursors.pop(new_id)
            reply["cursor"]["id"] = Int64(cid)
        return reply

    def kill_cursors(self, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        killed, missing = [], []
        for cid in cmd.get("cursors", []):
            (killed if self.cursors.pop(int(cid), None) is not None else missing).append(Int64(cid))
        return {"cursorsKilled": killed, "cursorsNotFound": missing, "cursorsAlive": [], "ok": 1.0}

    def count(self, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        return {"n": len(self.storage.collection(cmd["$db"], cmd["count"]).find(cmd.get("query"))), "ok": 1.0}

    def distinct(self, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        values: list[Any] = []
        for d in self.storage.collection(cmd["$db"], cmd["distinct"]).find(cmd.get("query")):
            v = d.get(cmd["key"])
            if v is not None and v not in values:
                values.append(v)
        return {"values": values, "ok": 1.0}

    def aggregate(self, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        """``$match``, ``$skip``, ``$limit`` and ``$group`` with ``{$sum: <number>}`` (count_documents)."""
        db, name = cmd["$db"], cmd["aggregate"]
        docs = self.storage.collection(db, name).find(None)
        for stage in cmd.get("pipeline", []):
            ((op, arg),) = stage.items()
            if op == "$match":
                docs = [d for d in docs if matches(d, arg)]
            elif op == "$skip":
                docs = docs[int(arg) :]
            elif op == "$limit":
                docs = docs[: int(arg)]
            elif op == "$group":
                out: Doc = {"_id": arg.get("_id")}
                for field, acc in arg.items():
                    if field != "_id":
                        out[field] = sum(acc["$sum"] for _ in docs)
                docs = [out] if docs else []
            else:
                raise ValueError(f"the test server does not support {op}")
        batch = (cmd.get("cursor") or {}).get("batchSize")
        return self._batch(f"{db}.{name}", docs, batch, False, True)

    def list_databases(self, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        dbs = [{"name": n, "sizeOnDisk": 0, "empty": False} for n in self.storage.databases()]
        return {"databases": dbs, "totalSize": 0, "ok": 1.0}

    def list_collections(self, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        db = cmd["$db"]
        names = [{"name": c, "type": "collection"} for d, c in self.storage.collections if d == db]
        return {
            "cursor": {"firstBatch": names, "id": Int64(0), "ns": f"{db}.$cmd.listCollections"},
            "ok": 1.0,
        }

    # -- writes ----------------------------------------------------------------------------------------
    def _statements(self, cmd: Doc, seqs: dict[str, list[Doc]], field: str) -> list[Doc]:
        return list(seqs.get(field, [])) + list(cmd.get(field) or [])

    def insert(self, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        coll = self.storage.collection(cmd["$db"], cmd["insert"])
        n = 0
        write_errors = []
        for i, doc in enumerate(self._statements(cmd, seqs, "documents")):
            if coll.insert(dict(doc)):
                n += 1
                self.applied_writes += 1
            else:
                write_errors.append(
                    {"index": i, "code": DUPLICATE_KEY, "errmsg": "E11000 duplicate key error"}
                )
                if cmd.get("ordered", True):
                    break
        reply: Doc = {"n": n, "ok": 1.0}
        if write_errors:
            reply["writeErrors"] = write_errors
        return reply

    def update(self, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        coll = self.storage.collection(cmd["$db"], cmd["update"])
        n = modified = 0
        upserted = []
        for i, st in enumerate(self._statements(cmd, seqs, "updates")):
            hits = [d for d in coll.docs if matches(d, st.get("q"))]
            if not st.get("multi"):
                hits = hits[:1]
            for d in hits:
                new = apply_update(d, st["u"])
                if new != d:
                    modified += 1
                    d.clear()
                    d.update(new)
                    self.applied_writes += 1
            n += len(hits)
            if not hits and st.get("upsert"):
                base = {k: v for k, v in (st.get("q") or {}).items() if not str(k).startswith("$")}
                new = apply_update(base, st["u"])
                new.setdefault("_id", bson.ObjectId())
                coll.insert(new)
                self.applied_writes += 1
                upserted.append({"index": i, "_id": new["_id"]})
                n += 1
        reply: Doc = {"n": n, "nModified": modified, "ok": 1.0}
        if upserted:
            reply["upserted"] = upserted
        return reply

    def delete(self, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        coll = self.storage.collection(cmd["$db"], cmd["delete"])
        n = 0
        for st in self._statements(cmd, seqs, "deletes"):
            removed = coll.delete(st.get("q"), int(st.get("limit", 0)))
            n += removed
            self.applied_writes += removed
        return {"n": n, "ok": 1.0}

    def drop(self, cmd: Doc, seqs: dict[str, list[Doc]]) -> Doc:
        if not self.storage.drop(cmd["$db"], cmd["drop"]):
            return error(26, "NamespaceNotFound", "ns not found")
        return {"ns": f"{cmd['$db']}.{cmd['drop']}", "ok": 1.0}
