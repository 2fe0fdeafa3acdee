"""The door on a gRPC listener (issue 12), with a real grpcio client: calls beyond the rate end
RESOURCE_EXHAUSTED with grpc-retry-pushback-ms and never reach the upstream; health checks are exempt;
a queued call goes ahead when its token is due; the refused call's span names the limiter and the reason."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from sidecar.testing.grpc_upstream import GrpcUpstream

from ..grpc.conftest import config, sidecar

S = grpc.StatusCode


def with_admission(endpoint: str, profile: dict[str, Any]) -> dict[str, Any]:
    cfg = config([endpoint], admission="front")
    cfg["admission"] = {"front": profile}
    return cfg


async def code_of(call: Any) -> tuple[grpc.StatusCode, dict[str, Any], str]:
    try:
        await call
        return S.OK, {}, ""
    except grpc.aio.AioRpcError as e:
        return e.code(), dict(e.trailing_metadata() or ()), e.details() or ""


async def test_calls_beyond_the_rate_are_resource_exhausted_with_pushback(up: GrpcUpstream) -> None:
    profile = {"requests": {"rate": 0.001, "burst": "3000s"}}  # three calls, then one per 1000 s
    async with sidecar(with_admission(up.endpoint, profile)) as sc:
        results = await asyncio.gather(*(code_of(sc.unary()(b"x")) for _ in range(10)))
        codes = [r[0] for r in results]
        assert codes.count(S.OK) == 3 and codes.count(S.RESOURCE_EXHAUSTED) == 7
        assert len(up.calls) == 3
        _, trailing, details = next(r for r in results if r[0] is S.RESOURCE_EXHAUSTED)
        assert 990_000 <= int(trailing["grpc-retry-pushback-ms"]) <= 1_000_000  # the next token (a slow run may take seconds)
        assert details.startswith("retry-sidecar: request rate limit of listener 'g' exceeded (rate-exceeded")
        assert sc.metric("sidecar_admission_rejected_total", listener="g", reason="rate-exceeded") == 7
        spans = await sc.spans.wait_requests(10)
        refused = [s for s in spans if s.attributes.get("sidecar.admission.limiter") == "requests"]
        assert len(refused) == 7
        assert refused[0].attributes["sidecar.admission.reason"] == "rate-exceeded"
        assert refused[0].attributes["sidecar.decision.reason"] == "admission-requests"


async def test_health_checks_and_exempt_addresses_are_never_limited(up: GrpcUpstream) -> None:
    profile = {"requests": {"rate": 0.001, "burst": "1s"}}
    async with sidecar(with_admission(up.endpoint, profile)) as sc:
        assert (await code_of(sc.unary()(b"x")))[0] is S.OK
        assert (await code_of(sc.unary()(b"x")))[0] is S.RESOURCE_EXHAUSTED
        for _ in range(3):
            assert (await code_of(sc.unary("/grpc.health.v1.Health/Check")(b"")))[0] is S.OK
        assert sc.metric("sidecar_admission_exempted_total", listener="g") == 3
    exempt = {"requests": {"rate": 0.001, "burst": "1s", "exempt_cidrs": ["127.0.0.1/32"]}}
    async with sidecar(with_admission(up.endpoint, exempt)) as sc:
        codes = await asyncio.gather(*(code_of(sc.unary()(b"x")) for _ in range(5)))
        assert [c[0] for c in codes] == [S.OK] * 5


async def test_a_queued_call_goes_ahead_when_its_token_is_due(up: GrpcUpstream) -> None:
    # one at once, then one each 500 ms: calls sent together queue (they would have to come 500 ms apart not to)
    profile = {"requests": {"rate": 2, "burst": "500ms", "max_queue": 10, "max_wait": "10s"}}
    async with sidecar(with_admission(up.endpoint, profile)) as sc:
        results = await asyncio.gather(*(code_of(sc.unary()(b"x")) for _ in range(4)))
        assert [r[0] for r in results] == [S.OK] * 4
        assert sc.metric("sidecar_admission_added_to_queue_total", listener="g") == 3
        assert sc.metric("sidecar_admission_successful_total", listener="g") == 4


async def test_a_call_whose_deadline_comes_before_its_token_is_refused_at_once(up: GrpcUpstream) -> None:
    profile = {"requests": {"rate": 1, "burst": "1s", "max_queue": 10, "max_wait": "5s"}}
    async with sidecar(with_admission(up.endpoint, profile)) as sc:
        assert (await code_of(sc.unary()(b"x")))[0] is S.OK
        code, _, details = await code_of(sc.unary()(b"x", timeout=0.2))  # the next token is ~1 s away
        assert code is S.RESOURCE_EXHAUSTED and "(deadline:" in details
        assert sc.metric("sidecar_admission_rejected_total", listener="g", reason="deadline") == 1


async def test_a_grpc_listener_cannot_limit_connections() -> None:
    import pytest

    from sidecar.config import ConfigError, load_dict

    cfg = with_admission("127.0.0.1:1", {"connections": {"rate": 10}})
    with pytest.raises(ConfigError) as e:
        load_dict(cfg, {})
    assert e.value.errors[0][0] == "listeners[0].admission"
    assert "grpc.aio accepts connections itself" in e.value.errors[0][1]
