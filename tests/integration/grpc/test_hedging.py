"""A6 hedging through the sidecar: the first response wins, the losers are cancelled at their upstream,
non-fatal failures send the next hedge at once, pushback "do not retry" stops hedging."""

from __future__ import annotations

import asyncio

import grpc

from sidecar.testing.grpc_upstream import GrpcUpstream, Step, fail

from .conftest import config, sidecar

S = grpc.StatusCode


def hedging(max_attempts: int = 2, delay: str = "0s", non_fatal: tuple = ("UNAVAILABLE",)) -> dict:
    return {
        "methodConfig": [
            {
                "name": [{"service": "pkg.Svc"}],
                "hedgingPolicy": {
                    "maxAttempts": max_attempts,
                    "hedgingDelay": delay,
                    "nonFatalStatusCodes": list(non_fatal),
                },
            }
        ]
    }


async def test_first_response_wins_and_the_loser_is_cancelled_at_its_upstream(
    up: GrpcUpstream, up2: GrpcUpstream
) -> None:
    both = asyncio.Event()
    up.default = Step(hold=asyncio.Event())  # never answers
    up2.default = Step(hold=both)  # answers once both copies are out
    async with sidecar(config([up.endpoint, up2.endpoint], service_config=hedging())) as sc:
        call = sc.unary()(b"x")
        await up.wait_calls(1)
        await up2.wait_calls(1)
        both.set()
        assert await call == b"x"
        (slow,) = up.calls
        await slow.cancelled.wait()  # cancelled, not left running
        assert len(up2.calls) == 1
        # the copies went to distinct endpoints; the hedge says it is one
        assert sorted([slow.previous_attempts, up2.calls[0].previous_attempts], key=str) == ["1", None]


async def test_streaming_response_commits_the_first_attempt_that_speaks(
    up: GrpcUpstream, up2: GrpcUpstream
) -> None:
    both = asyncio.Event()
    up.default = Step(hold=asyncio.Event())
    up2.default = Step(replies=3, hold=both)
    async with sidecar(config([up.endpoint, up2.endpoint], service_config=hedging())) as sc:
        call = sc.channel.unary_stream("/pkg.Svc/List")(b"s")
        await up.wait_calls(1)
        await up2.wait_calls(1)
        both.set()
        got = [m async for m in call]
        assert got == [b"s"] * 3
        await up.calls[0].cancelled.wait()


async def test_a_non_fatal_failure_sends_the_next_hedge_at_once(up: GrpcUpstream, up2: GrpcUpstream) -> None:
    up.default = fail()
    up2.default = fail()
    # with a one-minute hedging delay, only "at once" can finish this test in time
    async with sidecar(config([up.endpoint, up2.endpoint], service_config=hedging(3, "60s"))) as sc:
        up.then(fail())
        up2.then(fail())
        up.default = up2.default = Step()
        assert await sc.unary()(b"x") == b"x"
        assert len(up.calls) + len(up2.calls) == 3


async def test_a_fatal_status_ends_hedging(up: GrpcUpstream, up2: GrpcUpstream) -> None:
    up.default = up2.default = fail(S.INVALID_ARGUMENT)
    async with sidecar(config([up.endpoint, up2.endpoint], service_config=hedging(3, "60s"))) as sc:
        try:
            await sc.unary()(b"x")
            raise AssertionError("expected INVALID_ARGUMENT")
        except grpc.aio.AioRpcError as e:
            assert e.code() is S.INVALID_ARGUMENT
        assert len(up.calls) + len(up2.calls) == 1


async def test_pushback_stop_ends_hedging(up: GrpcUpstream, up2: GrpcUpstream) -> None:
    up.default = up2.default = fail(pushback="-1")
    async with sidecar(config([up.endpoint, up2.endpoint], service_config=hedging(3, "60s"))) as sc:
        try:
            await sc.unary()(b"x")
            raise AssertionError("expected UNAVAILABLE")
        except grpc.aio.AioRpcError as e:
            assert e.code() is S.UNAVAILABLE
        assert len(up.calls) + len(up2.calls) == 1


async def test_hedged_client_stream_is_replayed_to_each_copy(up: GrpcUpstream, up2: GrpcUpstream) -> None:
    hold = asyncio.Event()
    up.default = Step(hold=hold)
    up2.default = Step(hold=hold)

    async def stream():  # noqa: ANN202
        for i in range(10):
            yield b"%d," % i

    async with sidecar(config([up.endpoint, up2.endpoint], service_config=hedging())) as sc:
        call = sc.channel.stream_unary("/pkg.Svc/Upload")(stream())
        await up.wait_calls(1)
        await up2.wait_calls(1)
        await up.calls[0].read_all.wait()  # both copies have the whole stream before either answers
        await up2.calls[0].read_all.wait()
        hold.set()
        assert await call == b"".join(b"%d," % i for i in range(10))
        for u in (up, up2):
            await u.calls[0].finished.wait()
        assert up.calls[0].requests == up2.calls[0].requests == [b"%d," % i for i in range(10)]
