"""OP_COMPRESSED (2012): wire compression with snappy, zlib or zstd, through the libraries pymongo itself
uses and pymongo's own bounded decompression (``pymongo.compression_support``). Pure: bytes in, bytes out.
pymongo's module is imported with the first message compressed either way: importing any of pymongo loads
the whole driver (and cryptography: ~15 MB of RSS), which a listener and an upstream that compress nothing
never need (issue 27).

Each side negotiates on its own in its ``hello`` (:func:`negotiate`): the app side from the listener's
``compressors``, the upstream side from the upstream's (its URI's ``compressors``); a compressed app and an
uncompressed upstream work, and the reverse. As mongod does, a reply to a compressed request is compressed
with the same compressor. The messages the spec says are never compressed (the handshake and the
authentication commands: :data:`NEVER`) are not.

An inflated message is bounded before anything is inflated: the size the message declares must fit the cap
(``max_message_size`` on the app side), and the decompressor is told that size as its limit, so a small
message that would inflate past it is refused without the memory being spent (a compression bomb).
"""

from __future__ import annotations

import functools
import struct
import sys
from typing import Any

from . import wire

#: The compressor ids of the Wire Compression spec (pymongo's ``*Context.compressor_id``: a unit test checks).
IDS = {"snappy": 1, "zlib": 2, "zstd": 3}
NAMES = {v: k for k, v in IDS.items()}
ALL = frozenset(IDS)
#: Never compressed (the Wire Compression spec: the handshake and authentication).
NEVER = frozenset(
    {
        "hello",
        "isMaster",
        "ismaster",
        "saslStart",
        "saslContinue",
        "getnonce",
        "authenticate",
        "createUser",
        "updateUser",
        "copydbSaslStart",
        "copydbgetnonce",
        "copydb",
    }
)
_HEAD = struct.Struct("<iiB")  # originalOpcode, uncompressedSize, compressorId


@functools.cache
def _support() -> Any:
    """``pymongo.compression_support``, imported with the first message compressed."""
    from pymongo import compression_support

    return compression_support


def negotiate(ours: list[str] | tuple[str, ...], theirs: object) -> list[str]:
    """The compressors both sides have, in ``ours``' order of preference (what a hello answers, and the
    first of which the other side uses)."""
    if not isinstance(theirs, list):
        return []
    offered = {x for x in theirs if isinstance(x, str)}
    return [c for c in ours if c in offered]


def unwrap(
    header: wire.Header, payload: bytes, max_size: int, allowed: frozenset[str] | set[str]
) -> tuple[wire.Header, bytes, str]:
    """An OP_COMPRESSED message's original header and payload, inflated, and its compressor's name.
    ``wire.ProtocolError`` when it is malformed, uses a compressor not in ``allowed``, or would inflate past
    ``max_size`` (the whole message, header included) — checked before inflating."""
    if len(payload) < _HEAD.size:
        raise wire.ProtocolError("OP_COMPRESSED too short for its header")
    op, size, cid = _HEAD.unpack_from(payload, 0)
    name = NAMES.get(cid)
    if name is None or name not in allowed:
        what = f"compressor {name}" if name else f"compressor id {cid}"
        raise wire.ProtocolError(f"OP_COMPRESSED with {what}, which was not negotiated")
    if size < 0 or size + wire.HEADER_SIZE > max_size:
        raise wire.ProtocolError(
            f"OP_COMPRESSED message would inflate to {size + wire.HEADER_SIZE} bytes, over the limit of {max_size}"
        )
    if op == wire.OP_COMPRESSED:
        raise wire.ProtocolError("OP_COMPRESSED inside OP_COMPRESSED")
    try:
        inflated = _support().decompress(memoryview(payload)[_HEAD.size :], cid, size)
    except Exception as e:  # each library raises its own (pymongo's ProtocolError, ValueError, OSError, ...)
        raise wire.ProtocolError(f"OP_COMPRESSED ({name}) does not inflate: {e}") from None
    if len(inflated) != size:
        raise wire.ProtocolError(
            f"OP_COMPRESSED ({name}) inflated to {len(inflated)} bytes, not the {size} it declared"
        )
    return wire.Header(size + wire.HEADER_SIZE, header.request_id, header.response_to, op), inflated, name


_ZSTD: list[Any] = []  # one compressor, made once: a new one per message costs ~40 us, a frame ~3 us


def _zstd(body: bytes) -> bytes:
    """zstd as pymongo's ``ZstdContext`` (its library, its default level), with the compressor kept: each
    message is one whole frame (``FLUSH_FRAME``), so any zstd reader inflates it on its own. One event loop
    uses it at a time."""
    if not _ZSTD:
        if sys.version_info >= (3, 14):
            from compression import zstd
        else:
            from backports import zstd
        _ZSTD.append((zstd.ZstdCompressor(), zstd.ZstdCompressor.FLUSH_FRAME))
    compressor, flush = _ZSTD[0]
    out: bytes = compressor.compress(body, mode=flush)
    return out


def wrap(message: bytes, compressor: str, zlib_level: int = -1) -> bytes:
    """``message`` (a whole message, header included) as OP_COMPRESSED with ``compressor``."""
    length, request_id, response_to, op = wire.HEADER.unpack_from(message, 0)
    body = message[wire.HEADER_SIZE :]
    cid = IDS[compressor]
    if compressor == "zlib":
        packed = _support().ZlibContext(zlib_level).compress(body)
    elif compressor == "snappy":
        packed = _support().SnappyContext.compress(body)
    else:
        packed = _zstd(body)
    head = _HEAD.pack(op, len(body), cid)
    total = wire.HEADER_SIZE + len(head) + len(packed)
    return wire.HEADER.pack(total, request_id, response_to, wire.OP_COMPRESSED) + head + packed
