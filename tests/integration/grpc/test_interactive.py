"""Each request message goes upstream as it arrives, for every call shape: a client that sends one message and
waits for the answer gets it (grpcurl, reflection clients, chat-style calls); retries and hedges replay the
messages sent so far; a client-streaming upload is never cut by the per-try timeout while it flows."""

from __future__ import annotations

import asyncio
import threading

import grpc

from sidecar.testing.grpc_upstream import GrpcUpstream, Step, fail

from .conftest import config, sidecar

S = grpc.StatusCode


async def test_aio_bidi_one_message_then_wait_for_the_reply(up: GrpcUpstream) -> None:
    up.default = Step(echo_each=True)
    async with sidecar(config([up.endpoint])) as sc:
        for timeout in (None, 30.0):  # without a deadline, and with one
            chat = sc.channel.stream_stream("/pkg.Svc/Chat")(timeout=timeout)
            await chat.write(b"hello")
            assert await asyncio.wait_for(chat.read(), 30) == b"hello"  # before the client half-closes
            await chat.done_writing()
            assert await chat.read() is grpc.aio.EOF and await chat.code() is S.OK


async def test_sync_client_bidi_one_message_then_wait_for_the_reply(up: GrpcUpstream) -> None:
    up.default = Step(echo_each=True)
    async with sidecar(config([up.endpoint])) as sc:
        host, port = sc.app.address("g")

        def client(timeout: float | None) -> list[bytes]:
            answered = threading.Event()

            def requests():  # noqa: ANN202 - sends one message, then waits for the answer to send the end
                yield b"ping"
                if not answered.wait(30):
                    raise AssertionError("no answer to the first message")

            with grpc.insecure_channel(f"{host}:{port}") as ch:
                got = []
                for reply in ch.stream_stream("/pkg.Svc/Chat")(requests(), timeout=timeout):
                    got.append(reply)
                    answered.set()
                return got

        assert await asyncio.to_thread(client, None) == [b"ping"]
        assert await asyncio.to_thread(client, 30.0) == [b"ping"]


async def test_route_chat_several_turns(up: GrpcUpstream) -> None:
    up.default = Step(echo_each=True)
    async with sidecar(config([up.endpoint])) as sc:
        chat = sc.channel.stream_stream("/routeguide.RouteGuide/RouteChat")(timeout=30)
        for turn in range(10):  # each turn waits for its answer before the next note is sent
            await chat.write(b"note %d" % turn)
            assert await chat.read() == b"note %d" % turn
        await chat.done_writing()
        assert await chat.read() is grpc.aio.EOF


async def test_a_retry_replays_the_messages_sent_so_far_then_follows_the_live_ones(up: GrpcUpstream) -> None:
    up.then(fail(S.UNAVAILABLE, read=2))  # the first attempt fails after two messages, mid-request
    async with sidecar(config([up.endpoint])) as sc:
        call = sc.channel.stream_unary("/pkg.Svc/Upload")(timeout=30)
        await call.write(b"a")
        await call.write(b"b")
        assert await up.wait_requests(1, 2) == [b"a", b"b"]  # the retry got both, replayed
        await call.write(b"c")
        await call.done_writing()
        assert await call == b"abc"
        assert up.calls[0].requests == [b"a", b"b"] and up.calls[1].requests == [b"a", b"b", b"c"]
        assert up.previous_attempts() == [None, "1"]


async def test_a_hedge_replays_the_messages_sent_so_far(up: GrpcUpstream, up2: GrpcUpstream) -> None:
    hold = asyncio.Event()
    up.default = Step(hold=hold)
    up2.default = Step(hold=hold)
    hedging = {"hedging": {"max_attempts": 2, "delay": "0s"}}
    async with sidecar(config([up.endpoint, up2.endpoint], hedging)) as sc:
        call = sc.channel.stream_unary("/pkg.Svc/Upload")(timeout=30)
        await call.write(b"a")
        got = await asyncio.gather(up.wait_requests(0, 1), up2.wait_requests(0, 1))
        assert got == [[b"a"], [b"a"]]
        await call.write(b"b")
        await call.done_writing()
        hold.set()
        assert await call == b"ab"


async def test_a_flowing_upload_is_not_cut_by_the_per_try_timeout(up: GrpcUpstream) -> None:
    """The per-try timer starts once the whole request is upstream (Envoy): an upload slower than it, still
    flowing, is no timeout. (The client's pause is its own slowness, not a wait for the sidecar.)"""
    async with sidecar(config([up.endpoint], {"per_try_timeout": "300ms"})) as sc:
        call = sc.channel.stream_unary("/pkg.Svc/Upload")(timeout=30)
        for part in (b"1", b"2", b"3"):
            await call.write(part)
            await up.wait_requests(0, int(part))
            await asyncio.sleep(0.4)  # the client is slow: together longer than the per-try timeout
        await call.done_writing()
        assert await call == b"123"
        assert len(up.calls) == 1
        remaining = up.calls[0].time_remaining  # the attempt carried the client's deadline, not the per-try
        assert remaining is not None and remaining > 10
