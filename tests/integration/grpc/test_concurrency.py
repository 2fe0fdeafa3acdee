"""Execution control over gRPC (issue 12): methods in ``concurrency.read_methods`` take read tickets, all
others write tickets; the upstream never serves more calls at once than the limit; a full queue ends the call
with RESOURCE_EXHAUSTED and ``grpc-retry-pushback-ms``; health checks are exempt. Real grpcio clients, a real
grpc.aio upstream holding calls until the test lets them go: nothing sleeps."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from sidecar.testing.grpc_upstream import GrpcUpstream, Step
from tests.metrics import until

from .conftest import config, sidecar

S = grpc.StatusCode
HEALTH = "/grpc.health.v1.Health/Check"


def limited(endpoints: list[str], concurrency: dict[str, Any], policy: dict[str, Any] | None = None) -> dict:
    cfg = config(endpoints, {"per_try_timeout": "60s", **(policy or {})})
    cfg["upstreams"]["u"]["concurrency"] = concurrency
    return cfg


async def test_four_tickets_bound_the_upstream_from_32_clients() -> None:
    hold = asyncio.Event()
    cc = {"mode": "fixed", "initial": 4, "max_wait": "60s", "read_methods": ["/pkg.Reads/*"]}
    async with GrpcUpstream(Step(hold=hold)) as up, sidecar(limited([up.endpoint], cc)) as sc:
        calls = [
            asyncio.ensure_future(sc.unary("/pkg.Reads/Get" if i % 2 else "/pkg.Svc/Put")(b"%d" % i))
            for i in range(32)
        ]
        await up.wait_in_flight(4)
        await until(lambda: sc.metric("sidecar_concurrency_queued") == 28, "28 attempts queued")
        assert sc.metric("sidecar_concurrency_in_use", pool="read") == 2
        assert sc.metric("sidecar_concurrency_in_use", pool="write") == 2
        hold.set()
        assert await asyncio.gather(*calls) == [b"%d" % i for i in range(32)]
        assert up.peak_in_flight == 4 and up.count == 32
        assert sc.metric("sidecar_concurrency_in_use") == 0
        assert sc.metric("sidecar_admission_successful_total", pool="read") == 16


async def test_a_full_queue_is_resource_exhausted_while_health_checks_pass() -> None:
    hold = asyncio.Event()
    cc = {"mode": "fixed", "initial": 2, "max_queue": 0, "max_wait": "250ms"}
    async with GrpcUpstream() as up, sidecar(limited([up.endpoint], cc, {"max_attempts": 1})) as sc:
        up.then(Step(hold=hold))
        holding = asyncio.ensure_future(sc.unary("/pkg.Svc/Put")(b"a"))  # the one write ticket
        await up.wait_in_flight(1)
        try:
            await sc.unary("/pkg.Svc/Put")(b"b")
            raise AssertionError("not refused")
        except grpc.aio.AioRpcError as e:
            assert e.code() is S.RESOURCE_EXHAUSTED
            assert "concurrency limit" in (e.details() or "")
            assert dict(e.trailing_metadata() or ())["grpc-retry-pushback-ms"] == "250"
        assert await sc.unary(HEALTH)(b"h") == b"h"  # exempt: no ticket, no queue
        assert sc.metric("sidecar_admission_exempted_total") == 1
        assert sc.metric("sidecar_admission_rejected_total", reason="queue-full") == 1
        hold.set()
        assert await holding == b"a"
        assert up.count == 2  # the refused call never reached the upstream


async def test_a_cancelled_call_gives_its_ticket_back() -> None:
    hold = asyncio.Event()
    cc = {"mode": "fixed", "initial": 2, "max_wait": "60s", "abandoned_hold": "50ms"}
    async with GrpcUpstream() as up, sidecar(limited([up.endpoint], cc)) as sc:
        up.then(Step(hold=hold))
        first = sc.unary("/pkg.Svc/Put")(b"a")
        await up.wait_in_flight(1)
        second = sc.unary("/pkg.Svc/Put")(b"b")
        await until(lambda: sc.metric("sidecar_concurrency_queued") == 1, "one waiter")
        second.cancel()  # a waiting call goes away: out of the queue
        await until(lambda: sc.metric("sidecar_concurrency_queued") == 0, "the waiter gone")
        assert sc.metric("sidecar_admission_interrupted_in_queue_total") == 1
        first.cancel()  # the holding call goes away: its attempt is cancelled, the ticket back once the
        await until(lambda: sc.metric("sidecar_concurrency_in_use") == 0, "the ticket back")  # hold is over
        assert await sc.unary("/pkg.Svc/Put")(b"c") == b"c"
        assert up.count == 2
