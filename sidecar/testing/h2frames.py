"""Raw HTTP/2 bytes for tests that must send what no client library would: frames (RFC 9113 section 4.1) and
HPACK header blocks made of literal fields without Huffman coding (RFC 7541 section 6.2.2), which any
decoder must accept. Enough to open a gRPC call with any ``:path``; a dozen lines instead of a dependency
that refuses to encode invalid header values."""

from __future__ import annotations

import asyncio
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x4, 0x8, 0x20


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def _int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 section 5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A literal header field without indexing, new name, no Huffman."""
    return b"\x00" + _int(len(name), 7) + name + _int(len(value), 7) + value


def grpc_headers(
    path: bytes, authority: bytes = b"sidecar", extra: tuple[tuple[bytes, bytes], ...] = ()
) -> bytes:
    fields = (
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path),
        (b":authority", authority),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        *extra,
    )
    return b"".join(literal(n, v) for n, v in fields)


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


def grpc_call(path: bytes, body: bytes = b"", stream: int = 1) -> bytes:
    """HEADERS then one DATA frame ending the stream: a whole unary call."""
    return frame(HEADERS, END_HEADERS, stream, grpc_headers(path)) + frame(
        DATA, END_STREAM, stream, grpc_message(body)
    )


async def send_raw(host: str, port: int, data: bytes, read_for: float = 2.0) -> bytes:
    """Connect, send the preface, an empty SETTINGS and ``data``; read what comes back until the peer closes
    or ``read_for`` seconds pass without a byte; return it."""
    reader, writer = await asyncio.open_connection(host, port)
    got = bytearray()
    try:
        writer.write(PREFACE + frame(SETTINGS, 0, 0, b"") + data)
        await writer.drain()
        while True:
            try:
                async with asyncio.timeout(read_for):
                    chunk = await reader.read(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            got += chunk
    except ConnectionError:
        pass
    finally:
        writer.close()
    return bytes(got)
