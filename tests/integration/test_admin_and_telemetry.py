"""The admin port over real HTTP, and the spans and metrics the observer makes of a driven call."""

from __future__ import annotations

import asyncio
import math
import random

import aiohttp
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from sidecar.app import App
from sidecar.config import load_text
from sidecar.policy import BackoffSpec, Call, Jitter, Outcome, OutcomeClass, RetryPolicy
from sidecar.runtime import AttemptResult, drive
from sidecar.telemetry import Telemetry
from sidecar.upstream.balancer import Balancer

CONFIG = """
admin: {listen: "127.0.0.1:0"}
upstreams:
  db: {endpoints: ["127.0.0.1:27017"], auth: {username: app, password: "s3cret"}}
policies:
  gentle: {extends: http-default, max_attempts: 2}
"""


async def test_admin_endpoints() -> None:
    async with App(load_text(CONFIG, {})) as app, aiohttp.ClientSession() as http:
        assert app.admin is not None
        host, port = app.admin.address
        base = f"http://{host}:{port}"
        async with http.get(base + "/healthz") as r:
            assert r.status == 200
        async with http.get(base + "/readyz") as r:
            assert r.status == 200
        async with http.get(base + "/metrics") as r:
            text = await r.text()
            assert r.status == 200 and "text/plain" in r.headers["Content-Type"]
            assert "# TYPE sidecar_requests_total counter" in text
        async with http.get(base + "/config") as r:
            cfg = await r.json()
            assert cfg["upstreams"]["db"]["auth"]["password"] == "<redacted>"
            assert cfg["policies"]["gentle"]["max_attempts"] == 2
        app.ready = False
        async with http.get(base + "/readyz") as r:
            assert r.status == 503


class TwoTries:
    async def send(self, cmd, ctx):  # noqa: ANN001, ANN201
        self.headers = getattr(self, "headers", []) + [dict(ctx.headers)]
        cls = OutcomeClass.UNAVAILABLE if cmd.attempt == 1 else OutcomeClass.SUCCESS
        return AttemptResult(Outcome(cls, detail="503" if cmd.attempt == 1 else "200"), payload=cmd.attempt)

    def discard(self, payload) -> None:  # noqa: ANN001
        pass


async def test_one_request_span_and_one_child_span_per_attempt() -> None:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(span_exporter=exporter)
    policy = RetryPolicy(max_attempts=3, backoff=BackoffSpec(0.001, 0.001, 1.0, Jitter.NONE))
    call = Call(policy, picker=Balancer(["127.0.0.1:8081"]), rand=random.Random(1).random, deadline=math.inf)
    parent = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    attempter = TwoTries()
    with telemetry.request(
        listener="orders",
        upstream="orders",
        protocol="http",
        name="GET",
        attributes={"http.request.method": "GET"},
        parent=parent,
    ) as obs:
        await drive(call, attempter, obs)
    spans = exporter.get_finished_spans()
    server = [s for s in spans if s.kind is SpanKind.SERVER]
    clients = sorted(
        (s for s in spans if s.kind is SpanKind.CLIENT), key=lambda s: s.attributes["sidecar.attempt"]
    )
    assert len(server) == 1 and len(clients) == 2
    req = server[0]
    assert (
        format(req.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    )  # continues the caller's trace
    assert req.attributes["sidecar.attempts"] == 2 and req.attributes["sidecar.decision.reason"] == "success"
    first, second = clients
    assert all(c.parent.span_id == req.context.span_id for c in clients)
    assert first.attributes["sidecar.outcome"] == "unavailable"
    assert first.attributes["sidecar.decision.reason"] == "retry"
    assert "http.request.resend_count" not in first.attributes
    assert second.attributes["http.request.resend_count"] == 1
    assert second.attributes["sidecar.outcome"] == "success"
    assert (
        second.attributes["sidecar.endpoint"] == "127.0.0.1:8081" and second.attributes["server.port"] == 8081
    )
    # each attempt carried its own span's trace context upstream
    assert attempter.headers[1]["traceparent"].split("-")[2] == format(second.context.span_id, "016x")
    reg = telemetry.metrics.registry
    assert (
        reg.get_sample_value(
            "sidecar_attempts_total", {"listener": "orders", "upstream": "orders", "outcome": "unavailable"}
        )
        == 1
    )
    assert (
        reg.get_sample_value(
            "sidecar_retries_total", {"listener": "orders", "upstream": "orders", "outcome": "unavailable"}
        )
        == 1
    )
    assert (
        reg.get_sample_value(
            "sidecar_requests_total", {"listener": "orders", "upstream": "orders", "reason": "success"}
        )
        == 1
    )
    assert reg.get_sample_value("sidecar_inflight_requests", {"listener": "orders"}) == 0


async def test_metrics_without_tracing_and_throttle_gauge() -> None:
    async with App(load_text(CONFIG, {})) as app:
        up = app.services.upstream("db")
        bucket = up.throttle(app.services.policy("gentle").engine.throttle)
        assert bucket is not None
        bucket.tokens = 7.5
        reg = app.telemetry.metrics.registry
        assert reg.get_sample_value("sidecar_throttle_tokens", {"upstream": "db", "kind": "grpc"}) == 7.5
        await asyncio.sleep(0)
