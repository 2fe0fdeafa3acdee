"""Input number ``index`` of each wire format, made from ``seed`` and ``index`` alone (reproducible).

Each starts from real requests (seeds a client would send) and mutates them where each format can break:
HTTP/1.1 request lines, headers, framing and chunked bodies; HTTP/2 frames after a valid preface for gRPC
(frame headers, flags, stream ids, HPACK blocks, ``:path`` values, gRPC message prefixes, control frames);
MongoDB OP_MSG/OP_QUERY/OP_COMPRESSED headers, lengths, flags, sections and the BSON inside.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import bson

from .. import h2frames as h2
from .mutate import mutate

FORMATS = ("http", "grpc", "mongodb")


def rng_for(seed: int, fmt: str, index: int) -> random.Random:
    return random.Random(f"{seed}:{fmt}:{index}")


# -- HTTP/1.1 --------------------------------------------------------------------------------------------
HTTP_SEEDS = (
    b"GET /items?id=7&q=a%20b HTTP/1.1\r\nHost: api.local\r\nUser-Agent: fuzz/1\r\nAccept: */*\r\n\r\n",
    b"POST /submit HTTP/1.1\r\nHost: api.local\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\n"
    b"hello world",
    b"POST /chunks HTTP/1.1\r\nHost: api.local\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
    b"PUT /e HTTP/1.1\r\nHost: api.local\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
    b"GET / HTTP/1.0\r\n\r\n",
    b"GET /a HTTP/1.1\r\nHost: api.local\r\n\r\nGET /b HTTP/1.1\r\nHost: api.local\r\nConnection: close\r\n\r\n",
    b"DELETE /x/1 HTTP/1.1\r\nHost: api.local:8080\r\nX-YaTaxi-Client-TimeoutMs: 250\r\nConnection: keep-alive\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: api.local\r\n\r\n",
)
HTTP_TOKENS = (
    b"Content-Length: ",
    b"Transfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: xchunked\r\n",
    b"Host: ",
    b"Connection: close\r\n",
    b"Expect: 100-continue\r\n",
    b"Upgrade: websocket\r\n",
    b"HTTP/1.1",
    b"HTTP/2.0",
    b"GET ",
    b"CONNECT ",
    b"0\r\n\r\n",
    b';ext="q"',
    b"X-YaTaxi-Client-TimeoutMs: ",
)


def http(seed: int, index: int) -> bytes:
    rng = rng_for(seed, "http", index)
    return mutate(rng, rng.choice(HTTP_SEEDS), HTTP_TOKENS, HTTP_SEEDS)


# -- gRPC (HTTP/2) ------------------------------------------------------------------------------------
_PATHS = (b"/pkg.Svc/Get", b"/pkg.Svc/Chat", b"/grpc.health.v1.Health/Check", b"/a/b/c", b"/", b"")


def _path(rng: random.Random) -> bytes:
    path = rng.choice(_PATHS)
    if rng.random() < 0.4:
        path = mutate(rng, path, (b"/", b".", b"\xb2", b"\xff\xfe", b"%2F"))
    return path


def _headers(rng: random.Random) -> bytes:
    extra: list[tuple[bytes, bytes]] = []
    for _ in range(rng.randrange(4)):
        name = rng.choice(
            (b"grpc-timeout", b"grpc-encoding", b"x-custom-bin", b"te", b"content-type", b"x-a")
        )
        value = rng.choice(
            (b"1S", b"100m", b"gzip", b"AAEC", b"trailers", b"application/grpc+proto", b"\x00")
        )
        extra.append((name, mutate(rng, value) if rng.random() < 0.3 else value))
    block = h2.grpc_headers(_path(rng), extra=tuple(extra))
    if rng.random() < 0.2:
        block = mutate(rng, block, (b"\x80", b"\xbe", b"\x3f\xe1\x1f", b"\x20", b"\x0f\x2f"))
    return block


def _frames(rng: random.Random) -> list[bytes]:
    stream = rng.choice((1, 1, 1, 3, 2, 0, 0x7FFFFFFF))
    frames = [h2.frame(h2.HEADERS, h2.END_HEADERS, stream, _headers(rng))]
    body = rng.randbytes(rng.randrange(64))
    message = h2.grpc_message(body)
    if rng.random() < 0.2:
        message = mutate(rng, message)
    frames.append(h2.frame(h2.DATA, h2.END_STREAM, stream, message))
    control = (
        lambda: h2.frame(h2.PING, rng.choice((0, 1)), 0, rng.randbytes(rng.choice((8, 8, 7)))),
        lambda: h2.frame(
            h2.WINDOW_UPDATE,
            0,
            rng.choice((0, stream)),
            struct.pack(">I", rng.choice((0, 1, 2**31 - 1, 2**31))),
        ),
        lambda: h2.frame(
            h2.SETTINGS, rng.choice((0, 1)), 0, struct.pack(">HI", rng.randrange(10), rng.randrange(2**32))
        ),
        lambda: h2.frame(h2.RST_STREAM, 0, stream, struct.pack(">I", rng.randrange(16))),
        lambda: h2.frame(h2.PRIORITY, 0, stream, struct.pack(">IB", stream, 15)),
        lambda: h2.frame(h2.CONTINUATION, h2.END_HEADERS, stream, _headers(rng)),
        lambda: h2.frame(h2.GOAWAY, 0, 0, struct.pack(">II", 0, 0)),
        lambda: h2.frame(h2.PUSH_PROMISE, h2.END_HEADERS, stream, struct.pack(">I", 2) + _headers(rng)),
        lambda: h2.frame(rng.randrange(10, 256), rng.randrange(256), stream, rng.randbytes(8)),
        lambda: h2.frame(h2.HEADERS, rng.randrange(256), stream, _headers(rng)),
        lambda: h2.frame(h2.DATA, h2.PADDED | h2.END_STREAM, stream, bytes((rng.randrange(256),)) + message),
    )
    for _ in range(rng.randrange(3)):
        frames.insert(rng.randrange(len(frames) + 1), rng.choice(control)())
    return frames


def grpc(seed: int, index: int) -> bytes:
    """The bytes after the preface and the client's SETTINGS (which the runner sends first)."""
    rng = rng_for(seed, "grpc", index)
    frames = _frames(rng)
    if rng.random() < 0.3:  # break one frame's header: length, type, flags or stream
        i = rng.randrange(len(frames))
        f = bytearray(frames[i])
        field = rng.randrange(4)
        if field == 0:
            f[0:3] = rng.randrange(2**24).to_bytes(3, "big")
        elif field == 1:
            f[3] = rng.randrange(256)
        elif field == 2:
            f[4] = rng.randrange(256)
        else:
            f[5:9] = rng.randrange(2**32).to_bytes(4, "big")
        frames[i] = bytes(f)
    data = b"".join(frames)
    if rng.random() < 0.3:
        data = mutate(rng, data)
    return data


# -- MongoDB ----------------------------------------------------------------------------------------------
OP_REPLY, OP_QUERY, OP_COMPRESSED, OP_MSG = 1, 2004, 2012, 2013

_COMMANDS: tuple[Callable[[random.Random], dict], ...] = (
    lambda r: {"hello": 1, "$db": "admin", "client": {"driver": {"name": "fuzz", "version": "1"}}},
    lambda r: {"isMaster": 1, "$db": "admin", "helloOk": True},
    lambda r: {"ping": 1, "$db": "admin"},
    lambda r: {"find": "c", "filter": {"a": {"$gt": r.randrange(100)}}, "limit": 2, "$db": "fuzz"},
    lambda r: {
        "insert": "c",
        "documents": [{"a": r.randrange(100), "s": "x" * r.randrange(40)}],
        "$db": "fuzz",
    },
    lambda r: {"count": "c", "query": {}, "$db": "fuzz"},
    lambda r: {"aggregate": "c", "pipeline": [{"$match": {}}], "cursor": {}, "$db": "fuzz"},
    lambda r: {"endSessions": [{"id": bson.Binary(r.randbytes(16), 4)}], "$db": "admin"},
    lambda r: {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": b"", "$db": "admin"},
    lambda r: {"getMore": bson.Int64(r.randrange(1, 5)), "collection": "c", "$db": "fuzz"},
    lambda r: {
        "find": "c",
        "lsid": {"id": bson.Binary(r.randbytes(16), 4)},
        "txnNumber": bson.Int64(1),
        "startTransaction": True,
        "autocommit": False,
        "$db": "fuzz",
    },
)


def _header(length: int, request_id: int, op: int) -> bytes:
    return struct.pack("<iiii", length, request_id, 0, op)


def _op_msg(rng: random.Random, doc: dict) -> bytes:
    body = bson.encode(doc)
    if rng.random() < 0.3:
        body = mutate(
            rng, body, (b"\x02", b"\x03", b"\x04", b"\x10", b"\x12", b"$db\x00", b"\x00\x00\x00\x00")
        )
    sections = b"\x00" + body
    if rng.random() < 0.3:  # a kind-1 document sequence
        docs = b"".join(bson.encode({"a": i}) for i in range(rng.randrange(3)))
        ident = rng.choice((b"documents\x00", b"updates\x00", b"x\x00", b"\x00", b"documents"))
        sections += b"\x01" + struct.pack("<i", 4 + len(ident) + len(docs)) + ident + docs
    flags = 0
    if rng.random() < 0.2:
        flags = rng.choice((1, 2, 1 << 16, 1 << 4, rng.randrange(2**32)))
    payload = struct.pack("<I", flags) + sections
    if flags & 1 and rng.random() < 0.5:
        payload += rng.randbytes(4)
    return _header(16 + len(payload), rng.randrange(2**31), OP_MSG) + payload


def _op_query(rng: random.Random, doc: dict) -> bytes:
    query = bson.encode(doc)
    if rng.random() < 0.4:
        query = mutate(rng, query)
    collection = rng.choice((b"admin.$cmd\x00", b"fuzz.c\x00", b"admin.$cmd", b"\x00"))
    payload = struct.pack("<i", rng.choice((0, 4))) + collection + struct.pack("<ii", 0, -1) + query
    return _header(16 + len(payload), rng.randrange(2**31), OP_QUERY) + payload


def _op_compressed(rng: random.Random, doc: dict) -> bytes:
    inner = _op_msg(rng, doc)[16:]
    payload = struct.pack("<iiB", OP_MSG, len(inner), rng.randrange(4)) + inner
    return _header(16 + len(payload), rng.randrange(2**31), OP_COMPRESSED) + payload


def mongodb(seed: int, index: int) -> bytes:
    rng = rng_for(seed, "mongodb", index)
    doc = rng.choice(_COMMANDS)(rng)
    kind = rng.random()
    if kind < 0.6:
        msg = _op_msg(rng, doc)
    elif kind < 0.85:
        msg = _op_query(rng, doc)
    else:
        msg = _op_compressed(rng, doc)
    if rng.random() < 0.3:  # a header field made wrong: length, opcode or responseTo
        b = bytearray(msg)
        field = rng.randrange(3)
        if field == 0:
            b[0:4] = struct.pack(
                "<i", rng.choice((0, 15, 16, len(msg) - 1, len(msg) + 1, len(msg) * 2, -1, 2**31 - 1))
            )
        elif field == 1:
            b[12:16] = struct.pack(
                "<i", rng.choice((OP_REPLY, 2001, 2002, 2005, 2010, rng.randrange(-5, 3000)))
            )
        else:
            b[8:12] = rng.randbytes(4)
        msg = bytes(b)
    if rng.random() < 0.25:
        msg = mutate(rng, msg)
    if rng.random() < 0.15:  # a second message behind the first (pipelined)
        msg += _op_msg(rng, rng.choice(_COMMANDS)(rng))
    return msg


GENERATORS: dict[str, Callable[[int, int], bytes]] = {"http": http, "grpc": grpc, "mongodb": mongodb}
