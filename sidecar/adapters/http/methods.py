"""Extension methods (pure): llhttp parses only the methods on its own fixed list, while RFC 9110 9.1 lets a
method be any token (``BREW``, ``X-CUSTOM``). When the parser refuses a method, the request is parsed again
with a method it knows in its place, and the client's own method is put back once the head is parsed.

Where does the refused request begin? llhttp says only that it failed, not where: the requests before it in
the same packet are counted by parsing the packet again with a fresh parser, and the end of the last of them
is found by bisection (a few more parses, on this error path only).
"""

from __future__ import annotations

import contextlib
import re
from typing import Final

import httptools

#: A request's first bytes (after the empty lines RFC 9112 2.2 allows): its method, and whether the space
#: after it has arrived yet.
_START: Final = re.compile(rb"(?:\r?\n)*([!#$%&'*+.^_`|~0-9A-Za-z-]+)( )?")
#: The method llhttp parses in the client's method's place: any method llhttp knows that frames a request
#: body by its ``Content-Length`` or ``Transfer-Encoding`` alone (not HEAD, not CONNECT).
STAND_IN: Final = b"PUT"
#: A method longer than this is refused rather than held while it arrives.
MAX_METHOD: Final = 64


class _Counter:
    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def on_message_complete(self) -> None:
        self.n += 1


def _completed(data: bytes) -> int:
    """How many whole requests a fresh parser reads in ``data`` before it stops (at its end, or an error)."""
    counter = _Counter()
    with contextlib.suppress(httptools.HttpParserError, httptools.HttpParserUpgrade):
        httptools.HttpRequestParser(counter).feed_data(data)
    return counter.n


def message_start(data: bytes) -> int:
    """Where the request that stopped a fresh parser begins in ``data`` (after the whole ones before it)."""
    k = _completed(data)
    if k == 0:
        return 0
    lo, hi = 1, len(data)  # the shortest prefix holding k whole requests ends where the next one begins
    while lo < hi:
        mid = (lo + hi) // 2
        if _completed(data[:mid]) >= k:
            hi = mid
        else:
            lo = mid + 1
    return lo


class Rewrite:
    """``method``: the client's method (empty: it has not all arrived; ``rest`` is to be held until more
    comes). ``rest``: what to feed a fresh parser, the method replaced by :data:`STAND_IN`."""

    __slots__ = ("method", "rest")

    def __init__(self, method: bytes, rest: bytes) -> None:
        self.method = method
        self.rest = rest


def rewrite(data: bytes) -> Rewrite | None:
    """``data`` was fed to a parser at a request boundary and a request in it has a method llhttp refused:
    how to parse it again, or ``None`` when its method is no token (a malformed request)."""
    start = message_start(data)
    m = _START.match(data, start)
    if m is None:
        return None
    method = m.group(1)
    if m.group(2) is None:
        if m.end() < len(data) or len(method) > MAX_METHOD:
            return None  # something other than a space after the token
        return Rewrite(b"", data[m.start(1) :])  # the method's end has not arrived yet
    return Rewrite(method, STAND_IN + data[m.end(1) :])
