"""The route_guide-style service, directly and through the sidecar: every call shape, metadata (``-bin``
keys too), errors with details and binary trailers, gzip both ways, deadlines, cancellation, large messages."""

from __future__ import annotations

import asyncio

import grpc

from .conftest import Pair, Result, client_stream, result, server_stream, unary
from .route_guide import DETAILS_BIN

S = grpc.StatusCode
G = "/routeguide.RouteGuide/"
MIB = 1024 * 1024


async def test_unary_with_metadata_both_ways_including_binary_keys(pair: Pair) -> None:
    md = (("x-echo-plain", "v1"), ("x-echo-key-bin", b"\x00\x01\xff"), ("x-other", "kept"))
    r = await pair.same(lambda ch: unary(ch, G + "GetFeature", b"(1,2)", metadata=md))
    assert r.code is S.OK and r.messages == [b"feature at (1,2)"]
    assert ("x-head-key-bin", b"\x00\x01\xff") in r.initial and ("x-tail-plain", "v1") in r.trailing


async def test_server_streaming(pair: Pair) -> None:
    r = await pair.same(lambda ch: server_stream(ch, G + "ListFeatures", b"25"))
    assert r.code is S.OK and len(r.messages) == 25 and ("x-count", "25") in r.trailing


async def test_client_streaming(pair: Pair) -> None:
    points = [b"p%d" % i for i in range(40)]
    r = await pair.same(lambda ch: client_stream(ch, G + "RecordRoute", points))
    assert r.messages == [b"40 points: " + b",".join(points)]


async def test_client_streaming_with_no_message(pair: Pair) -> None:
    r = await pair.same(lambda ch: client_stream(ch, G + "RecordRoute", []))
    assert r.messages == [b"0 points: "]


async def test_bidi_route_chat_turn_by_turn(pair: Pair) -> None:
    async def chat(ch: grpc.aio.Channel) -> Result:
        call = ch.stream_stream(G + "RouteChat")(timeout=30)
        got = []
        for i in range(4):  # each note waits for its answers: an interactive exchange
            await call.write(b"note %d" % i)
            for _ in range(i + 1):
                got.append(await call.read())
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        return await result(call, got)

    r = await pair.same(chat)
    assert r.code is S.OK and r.messages[-1] == b"got: note 3" and len(r.messages) == 10


async def test_error_with_details_and_binary_trailers(pair: Pair) -> None:
    r = await pair.same(lambda ch: unary(ch, G + "Fail", b"(9,9)"))
    assert r.code is S.INVALID_ARGUMENT and r.details == "no feature at (9,9)"
    assert ("grpc-status-details-bin", DETAILS_BIN) in r.trailing


async def test_gzip_both_ways(pair: Pair) -> None:
    body = b"compressible " * 1000
    r = await pair.same(lambda ch: unary(ch, G + "Gzip", body, compression=grpc.Compression.Gzip))
    assert r.messages == [body * 2]


async def test_unimplemented_method(pair: Pair) -> None:
    r = await pair.same(lambda ch: unary(ch, G + "NoSuchMethod", b""))
    assert r.code is S.UNIMPLEMENTED


async def test_large_messages_up_to_the_4_mib_limit_and_over_it(pair: Pair) -> None:
    big = b"x" * (3 * MIB)
    r = await pair.same(lambda ch: unary(ch, G + "GetFeature", big))
    assert r.messages == [b"feature at " + big]
    direct, via = await pair.both(lambda ch: unary(ch, G + "GetFeature", b"x" * (5 * MIB)))
    # over the limit: refused alike (the sidecar applies the same 4 MiB default before the upstream does)
    assert direct.code is via.code is S.RESOURCE_EXHAUSTED and via.messages == direct.messages == []


async def test_client_deadline_expiring_upstream(pair: Pair) -> None:
    direct, via = await pair.both(lambda ch: server_stream(ch, G + "Wait", b"2", timeout=0.5))
    assert direct.code is via.code is S.DEADLINE_EXCEEDED
    assert via.messages == direct.messages == [b"tick 0", b"tick 1"]
    # details differ on purpose: whichever side noticed the deadline first words it (docs/grpc.md)
    assert [await pair.upstream.guide.ended.get() for _ in range(2)] == ["cancelled", "cancelled"]


async def test_cancellation_mid_stream_reaches_the_upstream(pair: Pair) -> None:
    async def cancel_after_two(ch: grpc.aio.Channel) -> list[bytes]:
        call = ch.unary_stream(G + "Wait")(b"2", timeout=30)
        got = [await call.read(), await call.read()]
        call.cancel()
        assert await call.code() is S.CANCELLED
        assert await asyncio.wait_for(pair.upstream.guide.ended.get(), 30) == "cancelled"
        return got

    assert await cancel_after_two(pair.direct) == await cancel_after_two(pair.via) == [b"tick 0", b"tick 1"]


async def test_sync_client_every_shape(pair: Pair) -> None:
    def run(target: str) -> list:
        with grpc.insecure_channel(target) as ch:
            out: list = [ch.unary_unary(G + "GetFeature")(b"(3,4)", metadata=(("x-echo-a", "b"),))]
            out.append(list(ch.unary_stream(G + "ListFeatures")(b"3")))
            out.append(ch.stream_unary(G + "RecordRoute")(iter([b"a", b"b"])))
            out.append(list(ch.stream_stream(G + "RouteChat")(iter([b"x", b"y"]))))
            try:
                ch.unary_unary(G + "Fail")(b"(0,0)")
            except grpc.RpcError as e:
                out.append((e.code(), e.details(), dict(e.trailing_metadata())["grpc-status-details-bin"]))
            return out

    direct = await asyncio.to_thread(run, pair.direct_target)
    assert await asyncio.to_thread(run, pair.via_target) == direct
    assert direct[-1] == (S.INVALID_ARGUMENT, "no feature at (0,0)", DETAILS_BIN)
