"""In-memory collections with the little query language the test server needs: equality and the comparison
operators on top-level (and dotted) fields, ``$set``/``$inc``/``$unset`` updates, replacement, upsert."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

_MISSING = object()


def _get(doc: Mapping[str, Any], path: str) -> Any:
    cur: Any = doc
    for part in path.split("."):
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        else:
            return _MISSING
    return cur


def _cmp(a: Any, b: Any, op: str) -> bool:
    try:
        if op == "$gt":
            return a > b
        if op == "$gte":
            return a >= b
        if op == "$lt":
            return a < b
        return a <= b
    except TypeError:
        return False


def _match_value(value: Any, cond: Any) -> bool:
    if isinstance(cond, Mapping) and cond and all(str(k).startswith("$") for k in cond):
        for op, arg in cond.items():
            if op == "$eq":
                ok = value == arg
            elif op == "$ne":
                ok = value != arg
            elif op in ("$gt", "$gte", "$lt", "$lte"):
                ok = value is not _MISSING and _cmp(value, arg, op)
            elif op == "$in":
                ok = value in list(arg)
            elif op == "$nin":
                ok = value not in list(arg)
            elif op == "$exists":
                ok = (value is not _MISSING) == bool(arg)
            else:
                raise ValueError(f"unknown operator {op}")
            if not ok:
                return False
        return True
    if isinstance(value, list) and not isinstance(cond, list):
        return cond in value
    return value == cond


def matches(doc: Mapping[str, Any], query: Mapping[str, Any] | None) -> bool:
    if not query:
        return True
    for key, cond in query.items():
        if key == "$and":
            if not all(matches(doc, q) for q in cond):
                return False
        elif key == "$or":
            if not any(matches(doc, q) for q in cond):
                return False
        elif not _match_value(_get(doc, key), cond):
            return False
    return True


def apply_update(doc: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """The document after ``update`` (operators, or a replacement keeping ``_id``)."""
    if not any(str(k).startswith("$") for k in update):
        new = {"_id": doc["_id"]} if "_id" in doc else {}
        new.update({k: v for k, v in update.items() if k != "_id"})
        return new
    new = copy.deepcopy(doc)
    for op, fields in update.items():
        for k, v in fields.items():
            if op == "$set":
                new[k] = v
            elif op == "$inc":
                new[k] = new.get(k, 0) + v
            elif op == "$unset":
                new.pop(k, None)
            else:
                raise ValueError(f"unknown update operator {op}")
    return new


class Collection:
    def __init__(self) -> None:
        self.docs: list[dict[str, Any]] = []

    def find(self, query: Mapping[str, Any] | None) -> list[dict[str, Any]]:
        return [d for d in self.docs if matches(d, query)]

    def insert(self, doc: dict[str, Any]) -> bool:
        """False when the ``_id`` is already there (duplicate key)."""
        if "_id" in doc and any(d.get("_id") == doc["_id"] for d in self.docs):
            return False
        self.docs.append(doc)
        return True

    def delete(self, query: Mapping[str, Any] | None, limit: int) -> int:
        n = 0
        keep: list[dict[str, Any]] = []
        for d in self.docs:
            if (limit == 0 or n < limit) and matches(d, query):
                n += 1
            else:
                keep.append(d)
        self.docs = keep
        return n


class Storage:
    def __init__(self) -> None:
        self.collections: dict[tuple[str, str], Collection] = {}

    def collection(self, db: str, name: str) -> Collection:
        key = (db, name)
        c = self.collections.get(key)
        if c is None:
            c = self.collections[key] = Collection()
        return c

    def drop(self, db: str, name: str) -> bool:
        return self.collections.pop((db, name), None) is not None

    def databases(self) -> list[str]:
        return sorted({db for db, _ in self.collections})
