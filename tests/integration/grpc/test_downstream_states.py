"""The client's side of a gRPC call (``Downstream``, adapters/grpc/downstream.py) as a state machine, inside a
real grpc.aio server call answered to a real grpcio client: every legal transition walked, and the steps it
does not have raised (a bug, never swallowed)."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from sidecar.adapters.grpc.answer import Answer
from sidecar.adapters.grpc.downstream import CallClosed, Downstream, State
from sidecar.adapters.transitions import InvalidTransition
from sidecar.admission.reasons import Limiter, Rejection
from sidecar.admission.refusal import Refusal
from sidecar.policy import Call, HedgingSpec, Outcome, OutcomeClass, RetryPolicy, SendAttempt
from sidecar.runtime import AttemptContext, AttemptResult, drive
from sidecar.upstream.balancer import Balancer

METHOD = "/test.States/Call"
OK = Outcome(OutcomeClass.SUCCESS)


class Span:
    """Where ``deliver`` records the status (the request's telemetry stands aside here)."""

    def __init__(self) -> None:
        self.status: Any = None
        self.ended: list[str | None] = []

    def set_attribute(self, key: str, value: Any) -> None:
        self.status = value

    def end(self, error: str | None = None) -> None:
        self.ended.append(error)


Handler = Callable[[grpc.aio.ServicerContext], Awaitable[None]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[grpc.aio.Channel]:
    async def call(request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await handler(context)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.States", {"Call": grpc.stream_stream_rpc_method_handler(call)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop(0)


def one_call(policy: RetryPolicy) -> Call:
    return Call(policy, picker=Balancer(["a:1", "b:2"]), rand=random.Random(1).random, deadline=math.inf)


async def test_a_call_answered_by_its_attempt_walks_every_state() -> None:
    seen: list[State] = []

    class Attempter:
        def __init__(self, down: Downstream) -> None:
            self.down = down

        async def send(self, cmd: SendAttempt, ctx: AttemptContext) -> AttemptResult:
            down = self.down
            with pytest.raises(InvalidTransition, match="write is not a transition from state 'open'"):
                await down.write(b"before the claim")
            assert down.claim(ctx) and down.claim(ctx)  # the owner keeps it
            seen.append(down.state)
            with pytest.raises(InvalidTransition, match="write is not a transition from state 'claimed'"):
                await down.write(b"before the headers")
            await down.send_headers((("x-a", "1"),), cmd.attempt)
            seen.append(down.state)
            with pytest.raises(
                InvalidTransition, match="send_headers is not a transition from state 'sending'"
            ):
                await down.send_headers((), cmd.attempt)
            await down.write(b"one")
            await down.write(b"two")
            return AttemptResult(OK)

        def discard(self, payload: Any) -> None:
            pass

    async def handler(context: grpc.aio.ServicerContext) -> None:
        down = Downstream(context)
        seen.append(down.state)
        await drive(one_call(RetryPolicy(max_attempts=1)), Attempter(down))
        await down.close()
        seen.append(down.state)
        with pytest.raises(CallClosed):
            await down.write(b"after the answer was decided")
        span = Span()
        down.deliver(Answer(grpc.StatusCode.OK, "", [("x-t", "2")]), span)  # type: ignore[arg-type]
        seen.append(down.state)
        assert span.status == 0 and span.ended == [None]
        with pytest.raises(InvalidTransition, match="deliver is not a transition from state 'answered'"):
            down.deliver(Answer(grpc.StatusCode.INTERNAL, "twice"), span)  # type: ignore[arg-type]
        with pytest.raises(InvalidTransition, match="close is not a transition from state 'answered'"):
            await down.close()

    async with serving(handler) as channel:
        call = channel.stream_stream(METHOD)()
        await call.done_writing()
        got = [m async for m in call]
        assert got == [b"one", b"two"]
        assert ("x-a", "1") in tuple(await call.initial_metadata())
        assert await call.code() is grpc.StatusCode.OK and ("x-t", "2") in tuple(
            await call.trailing_metadata()
        )
    assert seen == [State.OPEN, State.CLAIMED, State.SENDING, State.CLOSED, State.ANSWERED]


async def test_a_hedge_that_finds_the_client_claimed_has_lost() -> None:
    claims: dict[int, bool] = {}
    hedge: asyncio.Future[AttemptContext] = asyncio.get_running_loop().create_future()

    class Hedges:
        def __init__(self, down: Downstream) -> None:
            self.down = down

        async def send(self, cmd: SendAttempt, ctx: AttemptContext) -> AttemptResult:
            if cmd.attempt == 2:
                hedge.set_result(ctx)
                await asyncio.Event().wait()  # until the engine cancels it
            other = await hedge
            claims[1] = self.down.claim(ctx)
            claims[2] = self.down.claim(other)  # the hedge's response came second: the client is taken
            return AttemptResult(OK)

        def discard(self, payload: Any) -> None:
            pass

    async def handler(context: grpc.aio.ServicerContext) -> None:
        down = Downstream(context)
        policy = RetryPolicy(max_attempts=2, hedging=HedgingSpec(max_attempts=2, delay=0.0))
        await drive(one_call(policy), Hedges(down))
        assert down.owner == 1
        await down.close()
        down.deliver(Answer(grpc.StatusCode.ABORTED, "the first answered"), Span())  # type: ignore[arg-type]

    async with serving(handler) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await channel.unary_unary(METHOD)(b"")
    assert e.value.code() is grpc.StatusCode.ABORTED
    assert claims == {1: True, 2: False}


async def test_a_call_refused_at_the_door_is_answered_with_nothing_sent() -> None:
    async def handler(context: grpc.aio.ServicerContext) -> None:
        down = Downstream(context)
        span = Span()
        down.refused(Refusal(Limiter.REQUESTS, Rejection.RATE_EXCEEDED, 0.25, "listener 'api'"), span)  # type: ignore[arg-type]
        assert down.state is State.ANSWERED and span.ended == []  # the door's step ends the span
        with pytest.raises(InvalidTransition, match="send_headers is not a transition from state 'answered'"):
            await down.send_headers((), 1)

    async with serving(handler) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await channel.unary_unary(METHOD)(b"")
    assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ("grpc-retry-pushback-ms", "250") in tuple(e.value.trailing_metadata())
