"""One app's MongoDB session, run by whichever pymongo is on the path: ``python scenario.py URI sync|async``.

Prints one JSON document: the pymongo version, and each step's result or error (code, codeName, labels,
message) in canonical Extended JSON, so that two runs can be compared byte for byte. The differential test
runs it directly against a test server and through the sidecar, with pymongo 4.16 and 4.20, sync and async.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pymongo
from bson import json_util
from pymongo.errors import OperationFailure, PyMongoError

N = 250  # more than one batch: getMore and killCursors are exercised
BIG = "x" * (5 * 1024 * 1024)  # a 5 MiB document: several TCP reads each way


def canonical(value: Any) -> Any:
    return json.loads(json_util.dumps(value, json_options=json_util.CANONICAL_JSON_OPTIONS))


def failure(e: PyMongoError) -> dict[str, Any]:
    out: dict[str, Any] = {"error": type(e).__name__}
    if isinstance(e, OperationFailure):
        details = e.details or {}
        out.update(
            code=e.code,
            codeName=details.get("codeName"),
            errmsg=details.get("errmsg"),
            labels=sorted(details.get("errorLabels", [])),
        )
    return out


def steps(db: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The session, as (name, thunk) pairs; a thunk returns a value or an awaitable (async client)."""
    c = db.items
    docs = [{"_id": i, "k": i % 7, "s": "v" * (i % 50)} for i in range(N)]
    return [
        ("drop", lambda: c.drop()),
        ("insert_many", lambda: c.insert_many(docs)),
        ("insert_duplicate", lambda: c.insert_one({"_id": 3})),
        ("find_sorted_batches", lambda: c.find({"k": {"$gte": 2}}, sort=[("_id", -1)], batch_size=17)),
        ("find_limit_skip", lambda: c.find({}, sort=[("_id", 1)], skip=5, limit=12)),
        ("find_one_missing", lambda: c.find_one({"_id": -1})),
        ("find_one_projection", lambda: c.find_one({"_id": 42}, {"k": 1})),
        ("count_documents", lambda: c.count_documents({"k": 3})),
        ("estimated_count", lambda: c.estimated_document_count()),
        ("distinct", lambda: c.distinct("k")),
        ("aggregate", lambda: c.aggregate([{"$match": {"k": 5}}])),
        ("aggregate_refused", lambda: c.aggregate([{"$match": {"k": 5}}, {"$sort": {"_id": 1}}])),
        ("update_many", lambda: c.update_many({"k": 1}, {"$set": {"touched": True}})),
        ("update_upsert", lambda: c.update_one({"_id": 10_000}, {"$set": {"k": 99}}, upsert=True)),
        ("replace_one", lambda: c.replace_one({"_id": 7}, {"replaced": 1})),
        ("find_after_writes", lambda: c.find({"$or": [{"touched": True}, {"_id": 7}]}, sort=[("_id", 1)])),
        ("delete_many", lambda: c.delete_many({"k": 6})),
        ("delete_one", lambda: c.delete_one({"_id": 0})),
        ("count_after_deletes", lambda: c.count_documents({})),
        ("big_insert", lambda: db.big.insert_one({"_id": 1, "blob": BIG})),
        ("big_find", lambda: db.big.find_one({"_id": 1})),
        ("unknown_command", lambda: db.command("frobnicate", 1)),
        ("bad_operator", lambda: c.find_one({"$nonsense": 1})),
        ("list_collections", lambda: db.list_collection_names()),
        ("cursor_closed_early", lambda: c.find({}, batch_size=5).limit(0)),
        ("ping", lambda: db.command("ping")),
    ]


def result(name: str, value: Any) -> Any:
    if isinstance(value, pymongo.results.InsertManyResult):
        return {"inserted_ids": value.inserted_ids, "acknowledged": value.acknowledged}
    if isinstance(value, pymongo.results.InsertOneResult):
        return {"inserted_id": value.inserted_id}
    if isinstance(value, pymongo.results.UpdateResult):
        return {"matched": value.matched_count, "modified": value.modified_count, "upserted": value.upserted_id}
    if isinstance(value, pymongo.results.DeleteResult):
        return {"deleted": value.deleted_count}
    if name == "big_find" and value is not None:
        return {"_id": value["_id"], "sha256": hashlib.sha256(value["blob"].encode()).hexdigest()}
    if name == "list_collections":
        return sorted(value)
    return value


def run_sync(uri: str) -> dict[str, Any]:
    client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000)
    out: dict[str, Any] = {}
    try:
        for name, step in steps(client.compat):
            try:
                value = step()
                if isinstance(value, pymongo.cursor.Cursor | pymongo.command_cursor.CommandCursor):
                    value = list(value) if name != "cursor_closed_early" else _first(value)
                out[name] = canonical(result(name, value))
            except PyMongoError as e:
                out[name] = failure(e)
        with client.start_session() as s, s.start_transaction():
            client.compat.items.insert_one({"_id": "txn"}, session=s)
        out["transaction"] = canonical(client.compat.items.find_one({"_id": "txn"}))
    finally:
        client.close()
    return out


def _first(cursor: Any) -> Any:
    doc = next(cursor)
    cursor.close()  # before the last batch: killCursors goes out
    return doc


async def run_async(uri: str) -> dict[str, Any]:
    client = pymongo.AsyncMongoClient(uri, serverSelectionTimeoutMS=10_000)
    out: dict[str, Any] = {}
    try:
        for name, step in steps(client.compat):
            try:
                value = step()
                if isinstance(value, Awaitable):
                    value = await value
                if hasattr(value, "to_list"):  # an async cursor
                    if name == "cursor_closed_early":
                        doc = await value.next()
                        await value.close()
                        value = doc
                    else:
                        value = await value.to_list()
                out[name] = canonical(result(name, value))
            except PyMongoError as e:
                out[name] = failure(e)
        async with client.start_session() as s, await s.start_transaction():
            await client.compat.items.insert_one({"_id": "txn"}, session=s)
        out["transaction"] = canonical(await client.compat.items.find_one({"_id": "txn"}))
    finally:
        await client.close()
    return out


def main() -> None:
    uri, mode = sys.argv[1], sys.argv[2]
    steps_out = run_sync(uri) if mode == "sync" else asyncio.run(run_async(uri))
    print(json.dumps({"pymongo": pymongo.version, "steps": steps_out}, sort_keys=True))


if __name__ == "__main__":
    main()
