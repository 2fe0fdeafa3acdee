"""A6 retries through the sidecar: previous-attempt counts, clamping, throttling, pushback, commit points,
the replay buffer, cancellation and deadlines during backoff."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from sidecar.adapters.grpc.answer import DEADLINE_DETAILS
from sidecar.testing.grpc_upstream import GrpcUpstream, Step, fail

from .conftest import config, sidecar

S = grpc.StatusCode


async def call_code(coro) -> grpc.StatusCode:  # noqa: ANN001
    try:
        await coro
    except grpc.aio.AioRpcError as e:
        return e.code()
    return S.OK


async def test_retry_then_success_counts_previous_attempts(up: GrpcUpstream) -> None:
    up.fail_next(1)
    async with sidecar(config([up.endpoint])) as sc:
        call = sc.unary()(b"x")
        assert await call == b"x"
        assert up.previous_attempts() == [None, "1"]
        assert (await call.trailing_metadata())["grpc-previous-rpc-attempts"] == "1"


async def test_non_retryable_status_is_returned_at_once(up: GrpcUpstream) -> None:
    up.fail_next(1, S.PERMISSION_DENIED)
    async with sidecar(config([up.endpoint])) as sc:
        assert await call_code(sc.unary()(b"x")) is S.PERMISSION_DENIED
        assert len(up.calls) == 1


SERVICE_CONFIG = {
    "methodConfig": [
        {
            "name": [{}],
            "retryPolicy": {
                "maxAttempts": 9,
                "initialBackoff": "0.001s",
                "maxBackoff": "0.001s",
                "backoffMultiplier": 1,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ]
}


async def test_service_config_max_attempts_is_clamped_to_five(up: GrpcUpstream) -> None:
    up.default = fail(S.UNAVAILABLE)
    async with sidecar(config([up.endpoint], service_config=SERVICE_CONFIG)) as sc:
        assert await call_code(sc.unary()(b"x")) is S.UNAVAILABLE
        assert up.previous_attempts() == [None, "1", "2", "3", "4"]


# (answers the upstream gives to one request's attempts, upstream calls, client's code); tokens after.
THROTTLE_TABLE = [
    (["UNAVAILABLE", "UNAVAILABLE"], 2, S.UNAVAILABLE),  # 10 -> 9 -> retry -> 8
    (["UNAVAILABLE", "UNAVAILABLE"], 2, S.UNAVAILABLE),  # 8 -> 7 -> retry -> 6
    (["UNAVAILABLE", "OK"], 1, S.UNAVAILABLE),  # 6 -> 5: 5 is not above max/2: throttled
    (["OK"], 1, S.OK),  # 5.5
    (["UNAVAILABLE", "OK"], 1, S.UNAVAILABLE),  # 4.5: throttled
    (["OK"], 1, S.OK),  # 5.0
    (["OK"], 1, S.OK),  # 5.5
    (["OK"], 1, S.OK),  # 6.0
    (["UNAVAILABLE", "OK"], 1, S.UNAVAILABLE),  # 5.0: throttled
    (["OK"], 1, S.OK),  # 5.5
    (["OK"], 1, S.OK),  # 6.0
    (["OK"], 1, S.OK),  # 6.5
    (["UNAVAILABLE", "OK"], 2, S.OK),  # 5.5: above 5, retried -> 6.0
]


async def test_throttling_table_with_exact_upstream_calls(up: GrpcUpstream) -> None:
    sc_cfg = {
        "methodConfig": [
            {
                "name": [{"service": "pkg.Svc"}],
                "retryPolicy": {
                    "maxAttempts": 2,
                    "initialBackoff": "0.001s",
                    "maxBackoff": "0.001s",
                    "backoffMultiplier": 1,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ],
        "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.5},
    }
    async with sidecar(config([up.endpoint], service_config=sc_cfg)) as sc:
        for i, (answers, calls, code) in enumerate(THROTTLE_TABLE):
            before = len(up.calls)
            up.script.clear()
            up.then(*(Step() if a == "OK" else fail(S[a]) for a in answers))
            assert await call_code(sc.unary()(b"x")) is code, f"request {i + 1}"
            assert len(up.calls) - before == calls, f"request {i + 1}"
        assert sc.metric("sidecar_throttle_tokens") == pytest.approx(6.0)


async def test_pushback_is_waited_exactly_then_backoff_restarts(up: GrpcUpstream) -> None:
    policy = {
        "max_attempts": 4,
        "backoff": {"initial": "10ms", "max": "1s", "multiplier": 2, "jitter": "full"},
    }
    up.then(fail(), fail(pushback="30"), fail(), Step())
    async with sidecar(config([up.endpoint], policy), rand=lambda: 1.0) as sc:
        assert await sc.unary()(b"x") == b"x"
        delays = [s.attributes.get("sidecar.backoff_ms") for s in sc.spans.attempts()]
        # 10 ms (first backoff), 30 ms (pushback), 10 ms again (the sequence restarted), success
        assert delays == [10.0, 30.0, 10.0, None]


# (A repeated value cannot reach the sidecar: grpc core keeps one; tests/unit covers the rule.)
@pytest.mark.parametrize("pushback", ["-1", "soon", "1.5"])
async def test_pushback_stop_or_garbage_means_no_retry(up: GrpcUpstream, pushback: object) -> None:
    up.then(fail(pushback=pushback), Step())
    async with sidecar(config([up.endpoint])) as sc:
        assert await call_code(sc.unary()(b"x")) is S.UNAVAILABLE
        assert len(up.calls) == 1


async def test_no_retry_after_response_headers(up: GrpcUpstream) -> None:
    go = asyncio.Event()
    up.then(fail(headers=(("x-started", "1"),), hold=go), Step())
    async with sidecar(config([up.endpoint])) as sc:
        call = sc.channel.unary_stream("/pkg.Svc/List")(b"x")
        assert dict(await call.initial_metadata())["x-started"] == "1"  # forwarded while the upstream holds
        go.set()
        assert await call_code(call.read()) is S.UNAVAILABLE
        assert len(up.calls) == 1


async def test_no_retry_after_a_message(up: GrpcUpstream) -> None:
    up.then(fail(reply_before_failing=True, replies=2), Step())
    async with sidecar(config([up.endpoint])) as sc:
        got: list[bytes] = []
        try:
            async for m in sc.channel.unary_stream("/pkg.Svc/List")(b"x"):
                got.append(m)
            raise AssertionError("expected UNAVAILABLE")
        except grpc.aio.AioRpcError as e:
            assert e.code() is S.UNAVAILABLE
        assert got == [b"x", b"x"] and len(up.calls) == 1


async def test_request_larger_than_the_buffer_gets_one_attempt(up: GrpcUpstream) -> None:
    up.default = fail()
    async with sidecar(config([up.endpoint], {"replay_buffer": "1KiB"})) as sc:
        assert await call_code(sc.unary()(b"x" * 2048)) is S.UNAVAILABLE
        assert len(up.calls) == 1
        assert sc.metric("sidecar_buffer_exceeded_total") == 1

        async def stream():  # noqa: ANN202
            for _ in range(4):
                yield b"y" * 600

        assert await call_code(sc.channel.stream_unary("/pkg.Svc/Upload")(stream())) is S.UNAVAILABLE
        assert len(up.calls) == 2 and up.calls[1].requests == [b"y" * 600] * 4


async def test_streaming_request_is_replayed_whole_after_an_early_failure(up: GrpcUpstream) -> None:
    # The upstream ends the first two attempts before reading the request (grpc issue 36066's case).
    up.then(fail(early=True), fail(early=True), Step())

    async def stream():  # noqa: ANN202
        for i in range(20):
            yield b"%02d" % i

    async with sidecar(config([up.endpoint], {"max_attempts": 3})) as sc:
        got = await sc.channel.stream_unary("/pkg.Svc/Upload")(stream())
        assert got == b"".join(b"%02d" % i for i in range(20))
        assert up.previous_attempts() == [None, "1", "2"]
        assert up.calls[2].requests == [b"%02d" % i for i in range(20)]


async def test_client_cancel_during_backoff_stops_the_call(up: GrpcUpstream) -> None:
    up.default = fail()
    policy = {"backoff": {"initial": "60s", "max": "60s", "multiplier": 1, "jitter": "none"}}
    async with sidecar(config([up.endpoint], policy)) as sc:
        call = sc.unary()(b"x")
        await up.wait_calls(1)
        await up.calls[0].finished.wait()
        call.cancel()
        assert await call.code() is S.CANCELLED
        (request,) = await sc.spans.wait_requests(1)
        assert request.attributes["sidecar.decision.reason"] == "cancelled"
        assert len(up.calls) == 1


async def test_deadline_that_a_backoff_would_cross_ends_the_call_at_once(up: GrpcUpstream) -> None:
    up.default = fail()
    policy = {"backoff": {"initial": "60s", "max": "60s", "multiplier": 1, "jitter": "none"}}
    async with sidecar(config([up.endpoint], policy)) as sc:
        try:
            await sc.unary()(b"x", timeout=30)
            raise AssertionError("expected DEADLINE_EXCEEDED")
        except grpc.aio.AioRpcError as e:
            assert e.code() is S.DEADLINE_EXCEEDED and e.details() == DEADLINE_DETAILS  # from the sidecar
        assert len(up.calls) == 1
        # The attempt carried what remained (grpc rounds grpc-timeout up on the wire: allow 1 % + 2 ms).
        assert 0 < up.calls[0].time_remaining <= 30 * 1.01


async def test_deadline_header_expiry_cancels_the_attempt(up: GrpcUpstream) -> None:
    up.default = Step(hold=asyncio.Event())  # never answers
    async with sidecar(config([up.endpoint])) as sc:
        call = sc.unary()(b"x", metadata=(("x-yataxi-client-timeoutms", "200"),))
        assert await call_code(call) is S.DEADLINE_EXCEEDED
        assert await call.details() == DEADLINE_DETAILS
        seen = up.calls[0]
        await seen.finished.wait()  # the pending attempt was ended at the upstream (it never answered)
        assert 0 < seen.time_remaining <= 0.2 * 1.01 + 0.002
        assert 0 < int(seen.metadata["x-yataxi-client-timeoutms"]) <= 200
        assert sc.metric("sidecar_deadline_received_total") == 1


async def test_one_call_span_with_a_child_span_per_attempt(up: GrpcUpstream) -> None:
    up.fail_next(1)
    async with sidecar(config([up.endpoint])) as sc:
        await sc.unary("/pkg.Svc/Get")(b"x")
        (request,) = await sc.spans.wait_requests(1)
        assert request.name == "pkg.Svc/Get"
        assert request.attributes["rpc.system"] == "grpc"
        assert (request.attributes["rpc.service"], request.attributes["rpc.method"]) == ("pkg.Svc", "Get")
        assert request.attributes["rpc.grpc.status_code"] == 0
        attempts = sc.spans.attempts()
        assert [a.attributes["rpc.grpc.status_code"] for a in attempts] == [14, 0]
        assert [a.attributes.get("previous-rpc-attempts") for a in attempts] == [None, 1]
        assert all(a.parent.span_id == request.context.span_id for a in attempts)
        assert up.calls[1].metadata["traceparent"].split("-")[1] == format(request.context.trace_id, "032x")


async def test_overloaded_endpoint_is_avoided_by_the_retry(up: GrpcUpstream, up2: GrpcUpstream) -> None:
    up.default = fail(S.RESOURCE_EXHAUSTED)
    policy = {"retry_on": ["connect-failure", "reset", "unavailable", "overloaded"]}
    async with sidecar(config([up.endpoint, up2.endpoint], policy)) as sc:  # rand 0: the first pick is `up`
        assert await sc.unary()(b"x") == b"x"
        assert (len(up.calls), len(up2.calls)) == (1, 1)
        assert await sc.unary()(b"y") == b"y"  # the cooldown keeps the next call away from it too
        assert (len(up.calls), len(up2.calls)) == (1, 2)


async def test_per_attempt_timeout_from_the_service_config_retries(up: GrpcUpstream) -> None:
    up.then(Step(hold=asyncio.Event()))  # the first attempt never answers
    sc_cfg = {
        "methodConfig": [
            {
                "name": [{}],
                "retryPolicy": {
                    "maxAttempts": 2,
                    "initialBackoff": "0.001s",
                    "maxBackoff": "0.001s",
                    "backoffMultiplier": 1,
                    "retryableStatusCodes": ["UNAVAILABLE", "DEADLINE_EXCEEDED"],
                    "perAttemptRecvTimeout": "0.05s",
                },
            }
        ]
    }
    async with sidecar(config([up.endpoint], service_config=sc_cfg)) as sc:
        assert await sc.unary()(b"x", timeout=20) == b"x"
        assert up.previous_attempts() == [None, "1"]
        await up.calls[0].finished.wait()  # the timed-out attempt was ended at the upstream
        # the first attempt went out as the call began, before the request was complete: it carried the
        # client's deadline, and its per-try timer started once the request was all upstream; the retry
        # went out with the request complete: it carried the per-try timeout
        assert 10 < up.calls[0].time_remaining <= 21  # (grpc-timeout is encoded coarsely, rounded up)
        assert up.calls[1].time_remaining <= 0.05 * 1.01 + 0.002
