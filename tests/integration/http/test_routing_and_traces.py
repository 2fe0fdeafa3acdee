"""Routes, absolute-form (HTTP_PROXY) requests, and the spans a request leaves behind."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from sidecar.testing.http_upstream import FaultyUpstream

from .conftest import config, raw, sidecar


async def test_routes_by_path_prefix_and_host_with_the_listener_as_fallback(client, upstream) -> None:
    async with FaultyUpstream(body=b"users\n") as users, FaultyUpstream(body=b"admin\n") as admin:
        cfg = config(
            [upstream.endpoint],
            listener={
                "routes": [
                    {"match": {"path_prefix": "/users"}, "upstream": "users"},
                    {"match": {"host": "admin.internal"}, "upstream": "admin", "policy": "http-default"},
                ]
            },
            upstreams={"users": [users.endpoint], "admin": [admin.endpoint]},
        )
        async with sidecar(cfg) as sc:
            async with client.get(sc.url + "/users/7") as r:
                assert await r.text() == "users\n"
            async with client.get(sc.url + "/", headers={"Host": "admin.internal:8080"}) as r:
                assert await r.text() == "admin\n"
            async with client.get(sc.url + "/other") as r:
                assert await r.text() == "ok\n"
        assert (users.hits, admin.hits, upstream.hits) == (1, 1, 1)


async def test_http_proxy_absolute_form_goes_to_the_named_upstream(client, upstream) -> None:
    async with sidecar(config([upstream.endpoint])) as sc:
        async with client.get("http://api/items?page=2", proxy=sc.url) as r:  # HTTP_PROXY, by name
            assert r.status == 200
        async with client.get(f"http://{upstream.endpoint}/by-endpoint", proxy=sc.url) as r:
            assert r.status == 200
        async with client.get("http://example.com/", proxy=sc.url) as r:  # not an open proxy
            assert r.status == 403
            assert "not an open proxy" in await r.text()
        assert [s.path for s in upstream.received] == ["/items", "/by-endpoint"]
        assert upstream.received[0].headers["Host"] == "api"
        https = await raw(
            sc.host, sc.port, b"GET https://api/ HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n"
        )
        assert https.startswith(b"HTTP/1.1 403 ")


async def test_one_span_per_attempt_with_the_resend_count(client, upstream) -> None:
    exporter = InMemorySpanExporter()
    upstream.fail_next(2, 503)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with (
        sidecar(config([upstream.endpoint]), span_exporter=exporter) as sc,
        client.get(sc.url + "/orders/9", headers={"traceparent": parent}) as r,
    ):
        assert r.status == 200
    spans = exporter.get_finished_spans()
    (server,) = [s for s in spans if s.kind is SpanKind.SERVER]
    attempts = sorted(
        (s for s in spans if s.kind is SpanKind.CLIENT), key=lambda s: s.attributes["sidecar.attempt"]
    )
    assert (
        server.name == "GET" and format(server.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    )
    a = server.attributes
    assert a["http.request.method"] == "GET" and a["url.path"] == "/orders/9" and a["url.scheme"] == "http"
    assert a["http.response.status_code"] == 200 and a["sidecar.attempts"] == 3
    assert a["server.address"] == "127.0.0.1" and a["server.port"] == sc.port
    assert [s.attributes.get("http.request.resend_count") for s in attempts] == [None, 1, 2]
    assert [s.attributes["http.response.status_code"] for s in attempts] == [503, 503, 200]
    assert [s.attributes["sidecar.decision.reason"] for s in attempts] == ["retry", "retry", "success"]
    # each attempt carried its own span's context upstream, not the client's
    sent = [seen.headers["traceparent"].split("-")[2] for seen in upstream.received]
    assert sent == [format(s.context.span_id, "016x") for s in attempts]
