"""Change one top-level number of a command without re-encoding it: ``maxTimeMS`` on each attempt.

Retries must reach the server byte-identical apart from ``maxTimeMS`` (same ``lsid``, ``txnNumber``, same
documents), so the sidecar never decodes and re-encodes a command. To set ``maxTimeMS`` it walks the body's
top-level elements (the element sizes below are BSON's framing, not a codec: values are never decoded here)
and overwrites the number in place, keeping its type and width, or appends the field when it is absent.
"""

from __future__ import annotations

import struct

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")

# BSON element types whose value has a fixed width.
_FIXED = {
    0x01: 8,  # double
    0x06: 0,  # undefined
    0x07: 12,  # ObjectId
    0x08: 1,  # bool
    0x09: 8,  # UTC datetime
    0x0A: 0,  # null
    0x10: 4,  # int32
    0x11: 8,  # timestamp
    0x12: 8,  # int64
    0x13: 16,  # decimal128
    0x7F: 0,  # max key
    0xFF: 0,  # min key
}
_STRINGISH = {0x02, 0x0D, 0x0E}  # string, JavaScript code, symbol: int32 length + bytes
_SIZED = {0x03, 0x04, 0x0F}  # document, array, code with scope: int32 total size


class PatchError(ValueError):
    pass


def _value_end(doc: bytes, t: int, pos: int) -> int:
    if t in _FIXED:
        return pos + _FIXED[t]
    if t in _STRINGISH:
        return pos + 4 + _I32.unpack_from(doc, pos)[0]
    if t in _SIZED:
        return pos + _I32.unpack_from(doc, pos)[0]
    if t == 0x05:  # binary: int32 length + subtype byte + bytes
        return pos + 5 + _I32.unpack_from(doc, pos)[0]
    if t == 0x0B:  # regex: two C strings
        pos = doc.index(b"\x00", pos) + 1
        return doc.index(b"\x00", pos) + 1
    if t == 0x0C:  # DBPointer: string + ObjectId
        return pos + 4 + _I32.unpack_from(doc, pos)[0] + 12
    raise PatchError(f"unknown BSON element type {t:#04x}")


def find_field(doc: bytes, name: bytes) -> tuple[int, int] | None:
    """``(type, offset of the value)`` of top-level field ``name``, or ``None``."""
    end = len(doc) - 1
    pos = 4
    try:
        while pos < end:
            t = doc[pos]
            nul = doc.index(b"\x00", pos + 1)
            key = doc[pos + 1 : nul]
            value = nul + 1
            if key == name:
                return t, value
            pos = _value_end(doc, t, value)
    except (ValueError, struct.error, IndexError):
        raise PatchError("malformed BSON document") from None
    if pos != end:
        raise PatchError("malformed BSON document")
    return None


def set_number(doc: bytes, name: str, value: int) -> bytes:
    """``doc`` with top-level ``name`` set to ``value`` (in place if present as a number, else appended)."""
    key = name.encode()
    found = find_field(doc, key)
    if found is not None:
        t, at = found
        if t == 0x10 and -(2**31) <= value < 2**31:
            return doc[:at] + _I32.pack(value) + doc[at + 4 :]
        if t == 0x12:
            return doc[:at] + _I64.pack(value) + doc[at + 8 :]
        if t == 0x01:
            return doc[:at] + _F64.pack(float(value)) + doc[at + 8 :]
        raise PatchError(f"{name} is not a number (BSON type {t:#04x})")
    if -(2**31) <= value < 2**31:
        element = b"\x10" + key + b"\x00" + _I32.pack(value)
    else:
        element = b"\x12" + key + b"\x00" + _I64.pack(value)
    size = len(doc) + len(element)
    return _I32.pack(size) + doc[4:-1] + element + b"\x00"
