"""Commands that must reach the server that holds their state: a cursor's ``getMore``/``killCursors`` go to
the server that created the cursor; every statement of a transaction (same ``lsid`` + ``txnNumber``) goes to
the server of its first statement. Pure: ``now`` comes in with each call.

Both tables are bounded: entries unused for ``ttl`` seconds are dropped (servers time idle cursors out after
10 minutes and sessions after ``logicalSessionTimeoutMinutes``), and at most ``limit`` entries are kept,
oldest first out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

CURSOR_TTL = 10 * 60.0
TXN_TTL = 30 * 60.0
LIMIT = 100_000


class _Table:
    __slots__ = ("entries", "ttl", "limit")

    def __init__(self, ttl: float, limit: int) -> None:
        self.entries: OrderedDict[object, tuple[object, float]] = OrderedDict()
        self.ttl = ttl
        self.limit = limit

    def get(self, key: object, now: float) -> object | None:
        hit = self.entries.get(key)
        if hit is None:
            return None
        value, at = hit
        if now - at > self.ttl:
            del self.entries[key]
            return None
        self.entries[key] = (value, now)
        self.entries.move_to_end(key)
        return value

    def put(self, key: object, value: object, now: float) -> None:
        self.entries[key] = (value, now)
        self.entries.move_to_end(key)
        self._prune(now)

    def pop(self, key: object) -> None:
        self.entries.pop(key, None)

    def _prune(self, now: float) -> None:
        while self.entries:
            key, (_, at) = next(iter(self.entries.items()))
            if len(self.entries) > self.limit or now - at > self.ttl:
                del self.entries[key]
            else:
                break

    def __len__(self) -> int:
        return len(self.entries)


class Pins:
    def __init__(self, cursor_ttl: float = CURSOR_TTL, txn_ttl: float = TXN_TTL, limit: int = LIMIT) -> None:
        self.cursors = _Table(cursor_ttl, limit)
        self.transactions = _Table(txn_ttl, limit)

    # -- cursors ---------------------------------------------------------------------------------------
    def cursor(self, cursor_ids: Iterable[int], now: float) -> str | None:
        for cid in cursor_ids:
            endpoint = self.cursors.get(cid, now)
            if endpoint is not None:
                return endpoint  # type: ignore[return-value]
        return None

    def cursor_opened(self, cursor_id: int, endpoint: str, now: float) -> None:
        if cursor_id:
            self.cursors.put(cursor_id, endpoint, now)

    def cursor_closed(self, cursor_id: int) -> None:
        self.cursors.pop(cursor_id)

    # -- transactions ----------------------------------------------------------------------------------
    def transaction(self, lsid: bytes, txn_number: int, now: float) -> str | None:
        hit = self.transactions.get(lsid, now)
        if hit is None:
            return None
        number, endpoint = hit  # type: ignore[misc]
        return endpoint if number == txn_number else None

    def transaction_started(self, lsid: bytes, txn_number: int, endpoint: str, now: float) -> None:
        self.transactions.put(lsid, (txn_number, endpoint), now)

    def sessions_ended(self, lsids: Iterable[bytes]) -> None:
        for lsid in lsids:
            self.transactions.pop(lsid)
