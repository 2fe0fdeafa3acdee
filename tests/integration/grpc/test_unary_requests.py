"""``unary_requests``: methods whose request is one message go upstream in grpc's single-request form
(cheaper per call: bench/grpc_overhead.py), with the same answers, retries and replay as every call; a client
that sends a second message on such a method gets an error naming the setting, not half its request served."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from sidecar.config import ConfigError, load_dict
from sidecar.testing.grpc_upstream import GrpcUpstream, Step

from .conftest import config, sidecar

S = grpc.StatusCode


async def test_listed_unary_call_is_answered_and_retried_with_its_message(up: GrpcUpstream) -> None:
    up.fail_next(1)
    async with sidecar(config([up.endpoint], unary_requests=["pkg.Svc/Get"])) as sc:
        call = sc.unary("/pkg.Svc/Get")(b"one message")
        assert await call == b"one message"
        assert [c.requests for c in up.calls] == [[b"one message"], [b"one message"]]
        assert up.previous_attempts() == [None, "1"]


async def test_listed_server_streaming_call_streams_its_replies(up: GrpcUpstream) -> None:
    up.then(Step(replies=3))
    async with sidecar(config([up.endpoint], unary_requests=["pkg.Svc"])) as sc:
        replies = [m async for m in sc.channel.unary_stream("/pkg.Svc/List")(b"q")]
        assert replies == [b"q", b"q", b"q"]


async def test_a_second_message_on_a_listed_method_is_an_error_naming_the_setting(up: GrpcUpstream) -> None:
    hold = asyncio.Event()  # the upstream answers only when the test lets it: never before "b" is sent
    up.then(Step(hold=hold))
    async with sidecar(config([up.endpoint], unary_requests=["*"])) as sc:
        call = sc.channel.stream_stream("/pkg.Svc/Upload")(timeout=30)
        await call.write(b"a")
        await up.wait_requests(0, 1)  # the first message went upstream at once, in the single form
        await call.write(b"b")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        assert err.value.code() is S.INTERNAL
        assert "unary_requests" in (err.value.details() or "")
        assert up.calls[0].requests == [b"a"]  # never "b": the upstream saw a one-message request
        hold.set()


async def test_a_listed_method_called_with_no_message_goes_upstream_as_sent(up: GrpcUpstream) -> None:
    async with sidecar(config([up.endpoint], unary_requests=["pkg.Svc/Get"])) as sc:
        call = sc.channel.stream_stream("/pkg.Svc/Get")()
        await call.done_writing()
        assert [m async for m in call] == [b""]  # the test upstream echoes the (empty) request
        assert up.calls[0].requests == []


async def test_unlisted_methods_still_stream(up: GrpcUpstream) -> None:
    up.then(Step(echo_each=True))
    async with sidecar(config([up.endpoint], unary_requests=["pkg.Svc/Get"])) as sc:
        call = sc.channel.stream_stream("/pkg.Svc/Chat")()
        await call.write(b"hello")
        assert await call.read() == b"hello"  # interactive: answered before the client half-closes
        await call.done_writing()
        assert await call.code() is S.OK


@pytest.mark.parametrize("key", ["a/b/c", "pkg.Svc/*", "", 5])
def test_unary_requests_keys_are_checked(key: object) -> None:
    with pytest.raises(ConfigError) as err:
        load_dict(config(["127.0.0.1:1"], unary_requests=["pkg.Svc/Get", key]), {})
    assert "listeners[0].unary_requests[1]" in str(err.value)
