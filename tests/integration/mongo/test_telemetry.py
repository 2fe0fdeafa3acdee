"""Traces: one request span and one span per attempt, with the database semantic conventions."""

from __future__ import annotations

from opentelemetry.trace import SpanKind

from sidecar.testing.mongo import MongoTestServer

from .conftest import OVERLOAD, config, in_thread, sidecar


async def test_one_span_per_attempt_with_database_attributes() -> None:
    async with MongoTestServer("mongos") as up, sidecar(config([up.endpoint])) as sc:
        up.fail_command(["find"], times=2, **OVERLOAD)
        client = sc.client()
        try:
            await in_thread(lambda: client.shop.orders.find_one())
        finally:
            await in_thread(client.close)
        spans = sc.spans.get_finished_spans()
    (request,) = [s for s in spans if s.kind is SpanKind.SERVER and s.name == "find orders"]
    attempts = sorted(
        (
            s
            for s in spans
            if s.kind is SpanKind.CLIENT and s.parent and s.parent.span_id == request.context.span_id
        ),
        key=lambda s: s.attributes["sidecar.attempt"],
    )
    assert len(attempts) == 3
    for s in [request, *attempts]:
        assert s.attributes["db.system.name"] == "mongodb"
        assert s.attributes["db.operation.name"] == "find"
        assert s.attributes["db.collection.name"] == "orders"
        assert s.attributes["db.namespace"] == "shop"
    assert [a.attributes["sidecar.outcome"] for a in attempts] == ["overloaded", "overloaded", "success"]
    assert attempts[0].attributes["db.response.status_code"] == "462"
    assert attempts[0].attributes["server.port"] == up.port
    assert request.attributes["sidecar.attempts"] == 3
