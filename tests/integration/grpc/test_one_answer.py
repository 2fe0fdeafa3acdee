"""The client gets exactly one answer, even when the call's end races a response on its way to the client.

The server side of a call allows one operation of each kind in flight; the sidecar's status must never go out
beside a write (or headers) still in flight, and nothing may be sent after it (grpc would fail the status with
``GRPC_CALL_ERROR_TOO_MANY_OPERATIONS`` and the client would wait for it until its own deadline, or forever).
"""

from __future__ import annotations

import asyncio
import logging
import random

import grpc
import pytest

from sidecar.testing.grpc_upstream import GrpcUpstream, Step, fail

from .conftest import config, sidecar

S = grpc.StatusCode
MIB = 1024 * 1024


def batch_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """grpc's failed operations in the sidecar's handler (the test upstream's own, when the sidecar cancels
    a call it is still writing to, are that server's business)."""
    return [
        r.getMessage()
        for r in caplog.records
        if "ExecuteBatchError" in r.getMessage() and "sidecar/adapters/grpc" in (r.exc_text or "")
    ]


async def test_the_deadline_fires_while_a_response_message_is_in_flight(
    up: GrpcUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """The client reads nothing and announces a small HTTP/2 window, so the sidecar's first write to it (the
    one that also carries the response headers) stays in flight in grpc core; then the sidecar's deadline
    (from the deadline header: the client itself set none) ends the call. The status must wait for that
    write, and then reach the client after the message."""
    caplog.set_level(logging.ERROR)
    up.then(Step(replies=2))
    small_window = (("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0))
    async with sidecar(config([up.endpoint])) as sc:
        host, port = sc.app.address("g")
        async with grpc.aio.insecure_channel(f"{host}:{port}", options=small_window) as ch:
            call = ch.unary_stream("/pkg.Svc/List")(
                b"x" * MIB, metadata=(("x-yataxi-client-timeoutms", "300"),)
            )
            (attempt,) = await asyncio.wait_for(sc.spans.wait_attempts(1), 30)
            assert attempt.attributes["sidecar.cancelled"] == "deadline"  # the deadline ended it mid-response
            got = 0
            with pytest.raises(grpc.aio.AioRpcError) as e:
                async with asyncio.timeout(30):
                    async for m in call:
                        assert m == b"x" * MIB
                        got += 1
            assert e.value.code() is S.DEADLINE_EXCEEDED and got == 1
    assert batch_errors(caplog) == []


async def test_answers_racing_the_deadline_never_leave_a_call_without_its_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The demo's race, as a test of no hang: upstream answers land around a 40 ms deadline that only the
    sidecar knows (the client sent it in the deadline header and set no grpc deadline of its own), on
    retried and hedged methods. Every call must end with a status, well before the test's own bound."""
    caplog.set_level(logging.ERROR)
    rng = random.Random(7)

    def step(method: str) -> Step:
        if method.endswith("/Retried") and rng.random() < 0.3:
            return fail(S.UNAVAILABLE, delay=0.001)
        return Step(delay=rng.uniform(0.03, 0.05), replies=rng.choice((1, 3)))

    service_config = {
        "methodConfig": [
            {
                "name": [{"service": "pkg.Svc", "method": "Retried"}],
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.001s",
                    "maxBackoff": "0.005s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            },
            {
                "name": [{"service": "pkg.Svc", "method": "Hedged"}],
                "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.015s"},
            },
        ]
    }
    async with (
        GrpcUpstream(step) as a,
        GrpcUpstream(step) as b,
        sidecar(config([a.endpoint, b.endpoint], service_config=service_config)) as sc,
    ):
        md = (("x-yataxi-client-timeoutms", "40"),)

        async def one(i: int) -> grpc.StatusCode:
            call = sc.channel.unary_stream("/pkg.Svc/" + ("Retried", "Hedged")[i % 2])(b"q", metadata=md)
            try:
                async for _ in call:
                    pass
            except grpc.aio.AioRpcError as e:
                return e.code()
            return await call.code()

        codes = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(200))), 60)
    assert set(codes) <= {S.OK, S.DEADLINE_EXCEEDED, S.UNAVAILABLE}
    assert batch_errors(caplog) == []
