"""Forwarding: every call shape, metadata both ways, status details and binary trailers unchanged."""

from __future__ import annotations

import asyncio
import socket

import grpc

from sidecar.testing.grpc_upstream import GrpcUpstream, Step, fail

from .conftest import config, sidecar

S = grpc.StatusCode


async def test_unary_metadata_both_ways_and_binary_trailers(up: GrpcUpstream) -> None:
    details_bin = b"\x08\x0e\x12\x04down\x00\xff"
    up.then(
        Step(
            headers=(("x-reply", "h"),),
            trailing=(("x-trailer", "t"), ("grpc-status-details-bin", details_bin)),
        )
    )
    async with sidecar(config([up.endpoint])) as sc:
        call = sc.unary()(b"hello", metadata=(("x-app", "1"), ("x-token-bin", b"\x00\x01")))
        assert await call == b"hello"
        trailing = await call.trailing_metadata()
        assert trailing["x-trailer"] == "t" and trailing["grpc-status-details-bin"] == details_bin
        seen = up.calls[0]
        assert seen.method == "/pkg.Svc/Get"
        assert seen.metadata["x-app"] == "1" and seen.metadata["x-token-bin"] == b"\x00\x01"
        assert "grpc-previous-rpc-attempts" not in seen.metadata


async def test_error_status_details_and_trailers_reach_the_client(up: GrpcUpstream) -> None:
    up.then(
        fail(
            S.INVALID_ARGUMENT,
            details="bad field 'x' ünïcode",
            trailing=(("grpc-status-details-bin", b"\x01\x02"),),
        )
    )
    async with sidecar(config([up.endpoint])) as sc:
        try:
            await sc.unary()(b"x")
            raise AssertionError("expected an error")
        except grpc.aio.AioRpcError as e:
            assert e.code() is S.INVALID_ARGUMENT and e.details() == "bad field 'x' ünïcode"
            assert dict(e.trailing_metadata())["grpc-status-details-bin"] == b"\x01\x02"
        assert len(up.calls) == 1  # not retryable: returned at once


async def test_server_streaming_client_streaming_and_bidi(up: GrpcUpstream) -> None:
    async with sidecar(config([up.endpoint])) as sc:
        up.then(Step(replies=50))
        replies = [m async for m in sc.channel.unary_stream("/pkg.Svc/List")(b"r" * 1000)]
        assert replies == [b"r" * 1000] * 50

        async def requests():  # noqa: ANN202
            for i in range(100):
                yield b"%03d" % i

        got = await sc.channel.stream_unary("/pkg.Svc/Upload")(requests())
        assert got == b"".join(b"%03d" % i for i in range(100))
        assert len(up.calls[-1].requests) == 100

        up.then(Step(echo_each=True))
        chat = sc.channel.stream_stream("/pkg.Svc/Chat")()
        for i in range(5):  # ping-pong: each answer comes before the next message is sent
            await chat.write(b"m%d" % i)
            assert await chat.read() == b"m%d" % i
        await chat.done_writing()
        assert await chat.read() is grpc.aio.EOF and await chat.code() is S.OK


async def test_empty_request_stream(up: GrpcUpstream) -> None:
    async with sidecar(config([up.endpoint])) as sc:

        async def nothing():  # noqa: ANN202
            return
            yield

        assert await sc.channel.stream_unary("/pkg.Svc/Upload")(nothing()) == b""
        assert up.calls[0].requests == []


async def test_oversized_message_and_garbage_connection_do_not_hurt_others(up: GrpcUpstream) -> None:
    async with sidecar(config([up.endpoint], max_message_size="64KiB")) as sc:
        try:
            await sc.unary()(b"x" * (65 * 1024))
            raise AssertionError("expected RESOURCE_EXHAUSTED")
        except grpc.aio.AioRpcError as e:
            assert e.code() is S.RESOURCE_EXHAUSTED
        host, port = sc.app.address("g")
        with socket.create_connection((host, port)) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00garbage" * 100)
        assert await sc.unary()(b"still fine") == b"still fine"
        # the call goes upstream as it begins (a stream may wait for the server's first word), but the
        # refused message never does: that call was cancelled there
        assert [c.requests for c in up.calls if c.requests] == [[b"still fine"]]


async def test_connect_failure_is_retried_at_once_and_not_charged(up: GrpcUpstream) -> None:
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    async with sidecar(config([closed, up.endpoint])) as sc:  # rand 0: the first pick is the closed port
        assert await sc.unary()(b"x") == b"x"
        (attempt1, attempt2) = sc.spans.attempts()
        assert attempt1.attributes["sidecar.outcome"] == "connect-failure"
        assert attempt1.attributes["sidecar.decision.reason"] == "transparent-retry"
        assert attempt2.attributes["sidecar.endpoint"] == up.endpoint
        assert sc.metric("sidecar_throttle_tokens") == 10.0  # not counted against the bucket
        assert up.previous_attempts() == ["1"]


async def test_unreachable_upstream_gives_up_with_unavailable_and_pushback_stop() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    async with sidecar(config([closed])) as sc:
        try:
            await sc.unary()(b"x")
            raise AssertionError("expected UNAVAILABLE")
        except grpc.aio.AioRpcError as e:
            assert e.code() is S.UNAVAILABLE
            md = dict(e.trailing_metadata())
            assert md["grpc-retry-pushback-ms"] == "-1" and md["grpc-previous-rpc-attempts"] == "2"


async def test_stop_lets_a_call_in_flight_finish(up: GrpcUpstream) -> None:
    go = asyncio.Event()
    up.then(Step(hold=go))
    async with sidecar(config([up.endpoint])) as sc:
        call = sc.unary()(b"in flight")
        await up.wait_calls(1)
        stopping = asyncio.create_task(sc.app.stop(5.0))
        await asyncio.sleep(0)
        go.set()
        assert await call == b"in flight"
        await stopping
