"""The admin port's pages, apart from the server that carries them.

A route is a plain function: an ``AdminRequest`` in, an ``AdminResponse`` out (or an awaitable of one, for a
page that waits, such as a long poll). Nothing here knows the HTTP server underneath (``server.py``), so a
page is written once whatever carries it, and tested without a socket.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

TEXT = "text/plain; charset=utf-8"
JSON = "application/json"


@dataclass(frozen=True, slots=True)
class AdminRequest:
    """``path`` without its query; ``query``: the query's parameters (the first value of each); ``peer``: the
    client's IP address (``""`` when unknown); ``host``: the Host header as sent (``None`` without one)."""

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    peer: str = ""
    host: str | None = None


@dataclass(frozen=True, slots=True)
class AdminResponse:
    status: int
    body: bytes
    content_type: str = TEXT
    headers: tuple[tuple[str, str], ...] = ()


Route = Callable[[AdminRequest], "AdminResponse | Awaitable[AdminResponse]"]


def text(body: str, status: int = 200) -> AdminResponse:
    return AdminResponse(status, body.encode(), TEXT)


def as_json(value: Any, status: int = 200) -> AdminResponse:
    return AdminResponse(status, json.dumps(value, indent=2).encode(), JSON)


NOT_FOUND = AdminResponse(404, b"not found\n")
