"""Header rules of a forwarding proxy (pure): what is hop-by-hop, the request head the upstream is sent,
the response head the client is sent. Headers travel in the order they came as one flat list
(:data:`Headers`: lowercased name, name as received, value, for each header in turn), so that names are
lowered once, when parsed, and no tuple is made per header.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Final

#: Headers in the order they came, flat: each header is ``STRIDE`` entries (lowercased name, name as received,
#: value), so that names are lowered once and no tuple is made per header. Walk them with
#: ``for i in range(0, len(headers), STRIDE)`` and read ``headers[i]`` (the lowered name),
#: ``headers[i + NAME]`` and ``headers[i + VALUE]``: never a bare offset.
Headers = list[bytes]
NAME: Final = 1  # the name as received
VALUE: Final = 2
STRIDE: Final = 3

#: RFC 9110 7.6.1 connection-specific fields, plus the legacy ones proxies still meet.
HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-authenticate",
        b"proxy-authorization",
    }
)

ATTEMPT_HEADER: Final = b"x-sidecar-attempt"
DEADLINE_EXPIRED_HEADER: Final = b"x-yataxi-deadline-expired"
TRACE_HEADERS: Final = frozenset({b"traceparent", b"tracestate"})
#: Request headers the sidecar restates itself (framing, Host) or replaces per attempt.
_REQUEST_DROP: Final = HOP_BY_HOP | {
    b"host",
    b"content-length",
    b"expect",
    b"x-forwarded-for",
    ATTEMPT_HEADER,
}


_PLAIN_CONNECTION: Final = {
    b"keep-alive": b"keep-alive",
    b"close": b"close",
    b"Keep-Alive": b"keep-alive",
    b"Close": b"close",
}


_LOWER: Final[dict[bytes, bytes]] = {}


def lower_name(name: bytes) -> bytes:
    """``name.lower()``, remembered for the names met first (a lookup is cheaper than a method call)."""
    low = _LOWER.get(name)
    if low is None:
        low = name.lower()
        if len(_LOWER) < 1024:
            _LOWER[name] = low
    return low


def content_length(value: bytes) -> int:
    """``int(value)`` for a ``Content-Length`` (llhttp has checked it is digits): a loop over the digits,
    since compiled, ``int(bytes)`` is a generic call. Anything else goes to ``int`` (and its errors)."""
    n = 0
    for i in range(len(value)):
        c = value[i]
        if c < 48 or c > 57:
            return int(value)
        n = n * 10 + (c - 48)
    return n if value else int(value)


#: ``body_framing``: the body is chunked (Transfer-Encoding's last coding is ``chunked``).
CHUNKED: Final = -1
#: ``body_framing``: neither Content-Length nor Transfer-Encoding (a request has no body; a response's body
#: runs to the connection's close).
UNSTATED: Final = -2
#: ``body_framing``: a Transfer-Encoding whose last coding is not ``chunked`` (RFC 9112 6.3: a request is
#: refused with 400; a response's body runs to the connection's close).
NOT_CHUNKED: Final = -3


class BadRequest(Exception):
    """A request head that must not be forwarded (answered 400 with this message)."""


def body_framing(headers: Headers) -> int:
    """How a message's head frames its body (RFC 9112 6.3): its Content-Length (>= 0), or ``CHUNKED``,
    ``UNSTATED``, ``NOT_CHUNKED``. A Transfer-Encoding overrides a Content-Length; the last coding of the
    last Transfer-Encoding line decides. The one scan for requests (connection.py) and responses
    (upstream.py)."""
    length = UNSTATED
    te: bytes | None = None
    for i in range(0, len(headers), STRIDE):
        n = headers[i]
        if n == b"content-length":
            length = content_length(headers[i + VALUE])
        elif n == b"transfer-encoding":
            te = headers[i + VALUE]
    if te is None:
        return length
    return CHUNKED if te.rpartition(b",")[2].strip().lower() == b"chunked" else NOT_CHUNKED


def _line(lines: list[bytes], name: bytes, value: bytes) -> None:
    """Add ``name: value\\r\\n`` to ``lines`` (appends: compiled, cheaper than extending by a new tuple)."""
    lines.append(name)
    lines.append(b": ")
    lines.append(value)
    lines.append(b"\r\n")


def add_header(headers: Headers, name: bytes, value: bytes) -> None:
    headers.append(lower_name(name))
    headers.append(name)
    headers.append(value)


def header_list(pairs: Iterable[tuple[bytes, bytes]]) -> Headers:
    """``[(name, value), ...]`` as :data:`Headers`."""
    out: Headers = []
    for name, value in pairs:
        add_header(out, name, value)
    return out


def find_header(headers: Headers, lname: bytes) -> bytes | None:
    """The value of the first header named ``lname`` (lowercase)."""
    for i in range(0, len(headers), STRIDE):
        if headers[i] == lname:
            return headers[i + VALUE]
    return None


def connection_tokens(headers: Headers) -> frozenset[bytes]:
    """The lowercased options of every ``Connection`` header (``close``, ``keep-alive``, header names)."""
    out: set[bytes] = set()
    for i in range(0, len(headers), STRIDE):
        if headers[i] == b"connection":
            value = headers[i + VALUE]
            plain = _PLAIN_CONNECTION.get(value)
            if plain is not None:
                out.add(plain)
                continue
            out.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return frozenset(out)


def _nominated(headers: Headers) -> frozenset[bytes] | None:
    """The header names that ``Connection`` headers nominate as hop-by-hop; ``None`` for none (the usual
    ``Connection: keep-alive`` or ``close`` names no header, so no set is built for it)."""
    for i in range(0, len(headers), STRIDE):
        if headers[i] == b"connection" and headers[i + VALUE] not in _PLAIN_CONNECTION:
            return connection_tokens(headers)
    return None


class RequestHead:
    """``head``: request line and headers, without per-attempt lines and without the final blank line.
    ``host``: the Host passed on (``None``: each attempt names its endpoint). ``client_host``: the Host the
    client named. ``deadline``: the incoming deadline header's value. ``trace``: incoming trace context
    (``traceparent``/``tracestate``) when each attempt replaces it with its own."""

    __slots__ = ("head", "host", "client_host", "deadline", "trace")

    def __init__(
        self,
        head: bytes,
        host: bytes | None,
        client_host: bytes | None,
        deadline: bytes | None,
        trace: dict[str, str] | None,
    ) -> None:
        self.head = head
        self.host = host
        self.client_host = client_host
        self.deadline = deadline
        self.trace = trace


#: By deadline header: the drop set without, and with, the trace headers.
_DROP_SETS: Final[tuple[dict[bytes, frozenset[bytes]], dict[bytes, frozenset[bytes]]]] = ({}, {})


def _drop_set(deadline_header: bytes, replace_trace: bool) -> frozenset[bytes]:
    sets = _DROP_SETS[1] if replace_trace else _DROP_SETS[0]
    drop = sets.get(deadline_header)
    if drop is None:
        drop = _REQUEST_DROP | {deadline_header} | (TRACE_HEADERS if replace_trace else frozenset())
        sets[deadline_header] = drop
    return drop


def request_head(
    method: bytes,
    target: bytes,
    headers: Headers,
    *,
    client_ip: bytes,
    deadline_header: bytes,
    body_length: int | None,
    chunked: bool,
    authority: bytes | None = None,
    is_self: Callable[[bytes], bool] = lambda host: False,
    replace_trace: bool = False,
    upgrade: bytes | None = None,
) -> RequestHead:
    """The head of the request sent upstream.

    Hop-by-hop headers and those ``Connection`` names are dropped; ``X-Forwarded-For`` gets the client
    appended and ``X-Forwarded-Proto: http`` is added unless an earlier proxy set it; the body's framing
    is restated (``Content-Length`` or chunked); ``Expect`` is dropped (the sidecar answers
    ``100 Continue`` itself); the deadline header and ``x-sidecar-attempt`` are left to each attempt.
    ``Host``: an absolute-form request's authority, else the client's Host unless it names the sidecar
    itself (``is_self``), in which case each attempt names its endpoint. ``upgrade``: the client's
    ``Upgrade`` value, for a protocol switch the listener allows (WebSocket): said again with
    ``Connection: upgrade``, the two hop-by-hop headers that ask the upstream to switch.
    """
    drop = _drop_set(deadline_header, replace_trace)
    nominated = _nominated(headers)
    if nominated is not None:
        drop = drop | nominated
    lines = [method, b" ", target, b" HTTP/1.1\r\n"]
    client_host = None
    deadline = None
    trace: dict[str, str] | None = None
    xff: list[bytes] | None = None  # earlier proxies' X-Forwarded-For values
    proto = False
    for i in range(0, len(headers), STRIDE):
        low = headers[i]
        value = headers[i + VALUE]
        if low in drop:
            if low == b"host":
                if client_host is not None:  # RFC 9112 3.2: which one would the upstream believe?
                    raise BadRequest("more than one Host header")
                client_host = value
            elif low == deadline_header:
                deadline = value
            elif low == b"x-forwarded-for":
                if xff is None:
                    xff = []
                xff.append(value)
            elif replace_trace and low in TRACE_HEADERS:
                if trace is None:
                    trace = {}
                trace[low.decode("latin-1")] = value.decode("latin-1")
            continue
        if low == b"x-forwarded-proto":
            proto = True
        _line(lines, headers[i + NAME], value)
    if authority is not None:
        host = authority
    elif client_host is not None and not is_self(client_host):
        host = client_host
    else:
        host = None
    if host is not None:
        lines += (b"Host: ", host, b"\r\n")
    lines.append(b"X-Forwarded-For: ")
    if xff is not None:
        xff.append(client_ip)
        lines.append(b", ".join(xff))
    else:
        lines.append(client_ip)
    lines.append(b"\r\n")
    if not proto:
        lines.append(b"X-Forwarded-Proto: http\r\n")
    if chunked:
        lines.append(b"Transfer-Encoding: chunked\r\n")
    elif body_length is not None:
        lines.append(b"Content-Length: %d\r\n" % body_length)
    if upgrade is not None:
        lines += (b"Connection: upgrade\r\nUpgrade: ", upgrade, b"\r\n")
    return RequestHead(b"".join(lines), host, client_host, deadline, trace)


def upgrade_asked(headers: Headers) -> bytes | None:
    """The ``Upgrade`` value of a request that asks to switch protocols (``Connection: upgrade`` and an
    ``Upgrade`` header), else ``None``."""
    upgrade = None
    connection = False
    for i in range(0, len(headers), STRIDE):
        low = headers[i]
        if low == b"upgrade":
            upgrade = headers[i + VALUE].strip()
        elif low == b"connection":
            tokens = headers[i + VALUE].lower().split(b",")
            connection = connection or any(t.strip() == b"upgrade" for t in tokens)
    return upgrade if connection and upgrade else None


def upgrade_protocol(value: bytes) -> str:
    """The protocol an ``Upgrade`` value asks for first, by name (``websocket``; ``h2c``): lower case,
    without its version."""
    return value.split(b",")[0].split(b"/")[0].strip().lower().decode("latin-1")


def switching_head(reason: bytes, headers: Headers) -> bytes:
    """The ``101 Switching Protocols`` head the client gets: the upstream's end-to-end headers (the
    protocol's own, ``Sec-WebSocket-Accept``), and its ``Upgrade`` with ``Connection: upgrade``."""
    lines = [_status_line(101, reason)]
    upgrade = None
    nominated = _nominated(headers)
    for i in range(0, len(headers), STRIDE):
        low = headers[i]
        if low == b"upgrade":
            upgrade = headers[i + VALUE]
        if low in HOP_BY_HOP or (nominated is not None and low in nominated):
            continue
        _line(lines, headers[i + NAME], headers[i + VALUE])
    lines.append(b"Connection: upgrade\r\n")
    if upgrade is not None:
        lines += (b"Upgrade: ", upgrade, b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


def phrase(status: int) -> bytes:
    if status == 498:
        return b"Deadline Expired"
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b"Unknown"


_STATUS_LINES: Final[dict[int, tuple[bytes, bytes]]] = {}


def _status_line(status: int, reason: bytes) -> bytes:
    """``HTTP/1.1 200 OK\\r\\n``, made once per status (and reason) seen."""
    known = _STATUS_LINES.get(status)
    if known is not None and known[0] == reason:
        return known[1]
    line = b"HTTP/1.1 %d %s\r\n" % (status, reason or phrase(status))
    if len(_STATUS_LINES) < 256:
        _STATUS_LINES[status] = (reason, line)
    return line


def response_head(
    status: int,
    reason: bytes,
    headers: Headers,
    *,
    length: int | None,
    with_body: bool,
    client_version: str,
    keep_alive: bool,
) -> tuple[list[bytes], bool, bool]:
    """The head of an upstream response as the client gets it: the upstream's status, reason and end-to-end
    headers, reframed for the client connection. Returns (the head's pieces, ending with the blank line;
    whether the body goes chunked; whether the connection stays open). A body of unknown length goes
    chunked to an HTTP/1.1 client, and to an HTTP/1.0 client ends with the connection."""
    lines = [_status_line(status, reason)]
    nominated = _nominated(headers)
    for i in range(0, len(headers), STRIDE):
        low = headers[i]
        if low in HOP_BY_HOP or (nominated is not None and low in nominated):
            continue
        _line(lines, headers[i + NAME], headers[i + VALUE])
    chunked = False
    if with_body and length is None:
        if client_version == "1.1":
            chunked = True
            lines.append(b"Transfer-Encoding: chunked\r\n")
        else:
            keep_alive = False
    if not keep_alive:
        lines.append(b"Connection: close\r\n")
    elif client_version == "1.0":
        lines.append(b"Connection: keep-alive\r\n")
    lines.append(b"\r\n")
    return lines, chunked, keep_alive
