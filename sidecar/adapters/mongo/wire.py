"""The MongoDB wire protocol as pure functions: bytes in, messages out, and back (no sockets).

What the sidecar reads and writes:
* ``OP_MSG`` (2013): flag bits, one body section (kind 0), document-sequence sections (kind 1), an optional
  CRC-32C checksum. Every message the sidecar forwards is rebuilt from its sections with a new header, so
  the request id, the flags it passes on and the checksum are its own; the sections are copied byte for byte.
* ``OP_QUERY`` (2004) and ``OP_REPLY`` (1): only the legacy ``isMaster`` handshake that old drivers start
  with, which the sidecar answers itself.
* ``OP_COMPRESSED`` (2012): its header is framed here; ``compression.py`` unwraps and wraps it.

Documents are BSON; :mod:`bson` (pymongo's) encodes and decodes them. This module only checks that each
document's length prefix and terminator are where the framing says, so that a malformed message is refused
with a reason that names what was wrong instead of reaching an upstream.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass

OP_REPLY = 1
OP_QUERY = 2004
OP_COMPRESSED = 2012
OP_MSG = 2013

HEADER = struct.Struct("<iiii")
HEADER_SIZE = 16
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_REPLY_HEAD = struct.Struct("<iqii")

CHECKSUM_PRESENT = 1 << 0
MORE_TO_COME = 1 << 1
EXHAUST_ALLOWED = 1 << 16
_KNOWN_FLAGS = CHECKSUM_PRESENT | MORE_TO_COME | EXHAUST_ALLOWED
_REQUIRED_BITS = 0xFFFF  # bits 0-15 must be understood; 16-31 may be ignored

#: BSON's own limits: the smallest document is 5 bytes; mongod caps documents at 16 MiB + 16 KiB of slack.
MIN_DOC = 5
OP_NAMES = {OP_REPLY: "OP_REPLY", OP_QUERY: "OP_QUERY", OP_COMPRESSED: "OP_COMPRESSED", OP_MSG: "OP_MSG"}


class ProtocolError(Exception):
    """The bytes are not a message the sidecar can read. ``str(e)`` says what was wrong."""


@dataclass(frozen=True, slots=True)
class Header:
    length: int
    request_id: int
    response_to: int
    op_code: int


def parse_header(data: bytes, max_size: int) -> Header:
    """The 16-byte header; refuses lengths below the header's own size or above ``max_size``."""
    length, request_id, response_to, op_code = HEADER.unpack_from(data)
    if length < HEADER_SIZE:
        raise ProtocolError(f"message length {length} is smaller than the 16-byte header")
    if length > max_size:
        raise ProtocolError(f"message length {length} exceeds the limit of {max_size} bytes")
    return Header(length, request_id, response_to, op_code)


@dataclass(frozen=True, slots=True)
class Sequence:
    """A kind-1 section: ``identifier`` (``documents``, ``updates``, ``deletes``, ...) and its documents,
    kept as one run of raw BSON (``raw``) and split on demand."""

    identifier: str
    raw: bytes

    def documents(self) -> list[bytes]:
        return list(split_documents(self.raw, f"document sequence {self.identifier!r}"))


@dataclass(frozen=True, slots=True)
class Msg:
    """An OP_MSG. ``body`` is the kind-0 document's raw BSON; ``sections`` keeps every section in wire order,
    each as ``(kind, bytes after the kind byte)``, so that a forwarded message is the same bytes."""

    flags: int
    body: bytes
    sequences: tuple[Sequence, ...]
    sections: tuple[tuple[int, bytes], ...]

    @property
    def more_to_come(self) -> bool:
        return bool(self.flags & MORE_TO_COME)


@dataclass(frozen=True, slots=True)
class Query:
    """A legacy OP_QUERY: only ``<db>.$cmd`` queries (the handshake) are of interest."""

    flags: int
    collection: str
    skip: int
    limit: int
    query: bytes


@dataclass(frozen=True, slots=True)
class Reply:
    """A legacy OP_REPLY with its documents as raw BSON."""

    flags: int
    cursor_id: int
    starting_from: int
    documents: tuple[bytes, ...]


# -- parsing ------------------------------------------------------------------------------------------
def _document_at(data: bytes | memoryview, pos: int, end: int, what: str) -> int:
    """Check the BSON document framed at ``pos``; return where it ends."""
    if end - pos < MIN_DOC:
        raise ProtocolError(f"{what}: {end - pos} bytes left, too short for a BSON document")
    (size,) = _I32.unpack_from(data, pos)
    if size < MIN_DOC or pos + size > end:
        raise ProtocolError(f"{what}: BSON length {size} does not fit the {end - pos} bytes left")
    if data[pos + size - 1] != 0:
        raise ProtocolError(f"{what}: BSON document is not terminated by a zero byte")
    return pos + size


def split_documents(raw: bytes, what: str = "documents") -> list[bytes]:
    out: list[bytes] = []
    pos, end = 0, len(raw)
    while pos < end:
        nxt = _document_at(raw, pos, end, what)
        out.append(raw[pos:nxt])
        pos = nxt
    return out


def _cstring(data: bytes, pos: int, end: int, what: str) -> tuple[str, int]:
    nul = data.find(b"\x00", pos, end)
    if nul < 0:
        raise ProtocolError(f"{what}: missing the zero byte that ends a C string")
    try:
        return data[pos:nul].decode("utf-8"), nul + 1
    except UnicodeDecodeError:
        raise ProtocolError(f"{what}: C string is not UTF-8") from None


def parse_msg(payload: bytes, header: Header) -> Msg:
    """The body of an OP_MSG (the bytes after the header)."""
    end = len(payload)
    if end < 5:
        raise ProtocolError("OP_MSG too short for flag bits and a section")
    (flags,) = _U32.unpack_from(payload, 0)
    unknown = flags & _REQUIRED_BITS & ~_KNOWN_FLAGS
    if unknown:
        raise ProtocolError(f"OP_MSG sets required flag bits the sidecar does not know: {unknown:#x}")
    if flags & CHECKSUM_PRESENT:
        if end < 9:
            raise ProtocolError("OP_MSG has the checksum flag but no room for a checksum")
        end -= 4
        (sent,) = _U32.unpack_from(payload, end)
        head = HEADER.pack(header.length, header.request_id, header.response_to, header.op_code)
        if crc32c(payload[:end], crc32c(head)) != sent:
            raise ProtocolError("OP_MSG checksum does not match its contents")
    pos = 4
    body: bytes | None = None
    sequences: list[Sequence] = []
    sections: list[tuple[int, bytes]] = []
    while pos < end:
        kind = payload[pos]
        pos += 1
        if kind == 0:
            if body is not None:
                raise ProtocolError("OP_MSG has more than one body section (kind 0)")
            nxt = _document_at(payload, pos, end, "OP_MSG body")
            body = payload[pos:nxt]
            sections.append((0, body))
        elif kind == 1:
            if end - pos < 4:
                raise ProtocolError("OP_MSG document sequence: no room for its size")
            (size,) = _I32.unpack_from(payload, pos)
            if size < 5 or pos + size > end:
                raise ProtocolError(f"OP_MSG document sequence size {size} does not fit the message")
            nxt = pos + size
            ident, docs_at = _cstring(payload, pos + 4, nxt, "OP_MSG document sequence identifier")
            raw = payload[docs_at:nxt]
            split_documents(raw, f"OP_MSG document sequence {ident!r}")
            sequences.append(Sequence(ident, raw))
            sections.append((1, payload[pos:nxt]))
        else:
            raise ProtocolError(f"OP_MSG section kind {kind} is unknown (only 0 and 1 exist)")
        pos = nxt
    if body is None:
        raise ProtocolError("OP_MSG has no body section (kind 0)")
    return Msg(flags, body, tuple(sequences), tuple(sections))


def parse_query(payload: bytes) -> Query:
    end = len(payload)
    if end < 4:
        raise ProtocolError("OP_QUERY too short")
    (flags,) = _I32.unpack_from(payload, 0)
    collection, pos = _cstring(payload, 4, end, "OP_QUERY collection name")
    if end - pos < 8:
        raise ProtocolError("OP_QUERY too short for numberToSkip and numberToReturn")
    skip, limit = struct.unpack_from("<ii", payload, pos)
    pos += 8
    nxt = _document_at(payload, pos, end, "OP_QUERY query")
    query = payload[pos:nxt]
    if nxt < end:
        _document_at(payload, nxt, end, "OP_QUERY returnFieldsSelector")
    return Query(flags, collection, skip, limit, query)


def parse_reply(payload: bytes) -> Reply:
    end = len(payload)
    if end < _REPLY_HEAD.size:
        raise ProtocolError("OP_REPLY too short")
    flags, cursor_id, starting_from, n = _REPLY_HEAD.unpack_from(payload, 0)
    docs = split_documents(payload[_REPLY_HEAD.size :], "OP_REPLY documents")
    if len(docs) != n:
        raise ProtocolError(f"OP_REPLY says {n} documents but carries {len(docs)}")
    return Reply(flags, cursor_id, starting_from, tuple(docs))


# -- encoding -----------------------------------------------------------------------------------------
_ids = itertools.count(1)


def next_request_id() -> int:
    """Request ids for messages the sidecar originates (positive int32, wrapping)."""
    return next(_ids) & 0x7FFFFFFF


def encode_msg(
    request_id: int,
    response_to: int,
    flags: int,
    sections: tuple[tuple[int, bytes], ...] | list[tuple[int, bytes]],
    checksum: bool = False,
) -> bytes:
    """An OP_MSG from sections (``(0, body)`` / ``(1, size+identifier+documents)``)."""
    flags &= ~CHECKSUM_PRESENT
    if checksum:
        flags |= CHECKSUM_PRESENT
    parts = [b"", _U32.pack(flags)]
    length = HEADER_SIZE + 4
    for kind, raw in sections:
        parts.append(b"\x00" if kind == 0 else b"\x01")
        parts.append(raw)
        length += 1 + len(raw)
    if checksum:
        length += 4
    parts[0] = HEADER.pack(length, request_id, response_to, OP_MSG)
    data = b"".join(parts)
    if checksum:
        data += _U32.pack(crc32c(data))
    return data


def encode_body_msg(request_id: int, response_to: int, body: bytes, flags: int = 0) -> bytes:
    """An OP_MSG carrying one document (the common case: a command or a reply)."""
    length = HEADER_SIZE + 5 + len(body)
    return HEADER.pack(length, request_id, response_to, OP_MSG) + _U32.pack(flags) + b"\x00" + body


def encode_sequence(identifier: str, documents: list[bytes]) -> bytes:
    """The payload of a kind-1 section."""
    ident = identifier.encode() + b"\x00"
    docs = b"".join(documents)
    return _I32.pack(4 + len(ident) + len(docs)) + ident + docs


def encode_query(request_id: int, collection: str, query: bytes, flags: int = 0, limit: int = -1) -> bytes:
    name = collection.encode() + b"\x00"
    body = _I32.pack(flags) + name + struct.pack("<ii", 0, limit) + query
    return HEADER.pack(HEADER_SIZE + len(body), request_id, 0, OP_QUERY) + body


def encode_reply(request_id: int, response_to: int, documents: list[bytes], flags: int = 0) -> bytes:
    docs = b"".join(documents)
    body = _REPLY_HEAD.pack(flags, 0, 0, len(documents)) + docs
    return HEADER.pack(HEADER_SIZE + len(body), request_id, response_to, OP_REPLY) + body


def with_response_to(message: bytes, response_to: int) -> bytes:
    """The same message addressed as the answer to ``response_to`` (and a fresh request id)."""
    return message[:4] + _I32.pack(next_request_id()) + _I32.pack(response_to) + message[12:]


# -- CRC-32C (Castagnoli), for the optional OP_MSG checksum --------------------------------------------
# Checksums are rare (the common drivers never send them), so a table-driven implementation is plenty and
# saves a compiled dependency.
def _table() -> list[int]:
    poly = 0x82F63B78
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        out.append(c)
    return out


_CRC_TABLE = _table()


def crc32c(data: bytes | memoryview, crc: int = 0) -> int:
    c = crc ^ 0xFFFFFFFF
    t = _CRC_TABLE
    for b in bytes(data):
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
