"""HTTP upstreams by name: every address of the name is an endpoint (spread, overload avoidance, ejection),
the set follows the DNS answers (a replaced address drains: its requests in flight finish, its kept-alive
connections close, nothing more goes to it), a failed resolution keeps the last good set, an empty one is
answered 503 at once. aiohttp clients, FaultyUpstream servers on 127.0.0.2-4, dnsmasq."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from sidecar.testing.dns_server import DnsServer
from sidecar.testing.http_upstream import Fault, FaultyUpstream
from tests.metrics import metric, until

from .conftest import (
    DNS,
    HOSTS,
    addresses,
    admin,
    get_many,
    on_one_port,
    resolutions,
    running,
    sidecar_config,
    url,
)

pytestmark = pytest.mark.timeout(60)


async def upstreams(**kw) -> list[FaultyUpstream]:  # noqa: ANN003
    async def make(host: str, port: int) -> FaultyUpstream:
        return await FaultyUpstream(host=host, **kw).start(port)

    return await on_one_port(make)


@pytest.fixture
async def trio() -> list[FaultyUpstream]:
    ups = await upstreams()
    yield ups
    for u in ups:
        await u.stop()


@pytest.fixture
async def http() -> aiohttp.ClientSession:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
        yield s


@pytest.mark.parametrize(
    "form", ["orders.test:{port}", "dns:///orders.test:{port}"], ids=["name", "dns-scheme"]
)
async def test_requests_spread_over_every_address_of_the_name(
    dns: DnsServer, trio: list[FaultyUpstream], http: aiohttp.ClientSession, form: str
) -> None:
    port = trio[0].port
    await dns.set("orders.test", list(HOSTS))
    spans = InMemorySpanExporter()
    async with running(sidecar_config(dns, [form.format(port=port)]), span_exporter=spans) as app:
        answers = await get_many(http, url(app), 30, at_once=6)
        assert answers == [(200, "ok\n")] * 30
        hits = [u.hits for u in trio]
        assert sum(hits) == 30 and min(hits) >= 4, hits  # was 15 / 15 / 0 with the name as one endpoint
        # the upstream is told the name the client would have used, not the address it resolved to
        assert {s.headers["Host"] for u in trio for s in u.received} == {f"orders.test:{port}"}
        assert sorted(addresses(app)) == sorted(f"{h}:{port}" for h in HOSTS)
        attempts = [s for s in spans.get_finished_spans() if s.kind is SpanKind.CLIENT]
        assert {s.attributes["sidecar.endpoint"] for s in attempts} == set(addresses(app))


async def test_an_overloaded_address_and_a_dead_one_are_steered_around(
    dns: DnsServer, http: aiohttp.ClientSession
) -> None:
    overloaded, dead, healthy = ups = await upstreams()
    overloaded.fail_rate = 1.0
    overloaded.fail = Fault(503)
    await dead.stop()  # refuses connections
    port = healthy.port
    await dns.set("orders.test", list(HOSTS))
    try:
        async with running(sidecar_config(dns, [f"orders.test:{port}"])) as app:
            answers = await get_many(http, url(app), 30, at_once=6)
            ok = sum(1 for status, _ in answers if status == 200)
            assert ok == 30, Counter(answers)  # was 0 of 30 with the name as one endpoint
            assert healthy.hits >= 30
            # the dead address is out of the rotation by outlier detection, seen per address
            assert metric(app, "sidecar_endpoint_ejected", upstream="u", endpoint=f"{dead.host}:{port}") == 1
            assert metric(app, "sidecar_upstream_endpoints", upstream="u", state="ejected") >= 1
            assert metric(app, "sidecar_attempts_total", outcome="overloaded") >= 1
    finally:
        for u in ups:
            await u.stop()


async def test_an_address_replaced_in_dns_drains(
    dns: DnsServer, trio: list[FaultyUpstream], http: aiohttp.ClientSession
) -> None:
    old, stays, new = trio
    port = old.port
    await dns.set("orders.test", [old.host, stays.host])
    async with running(sidecar_config(dns, [f"orders.test:{port}"])) as app:
        # kept-alive connections to both addresses, as a busy client would have
        await get_many(http, url(app), 20, at_once=4)
        assert old.hits > 0 and old.open_connections > 0
        # a request in flight on the old address when it leaves
        old.hold = asyncio.Event()
        in_flight: asyncio.Task[tuple[int, str]] | None = None
        while in_flight is None:
            task = asyncio.ensure_future(get_many(http, url(app), 1, 1))
            done, _ = await asyncio.wait(
                {task, asyncio.ensure_future(old.wait_in_flight(1))}, return_when="FIRST_COMPLETED"
            )
            if old.in_flight:
                in_flight = task
            else:
                await task  # it went to the other address: try again
        loop = asyncio.get_running_loop()
        changed = loop.time()
        await dns.set("orders.test", [stays.host, new.host])
        await until(
            lambda: new.hits > 0 or f"{new.host}:{port}" in addresses(app), "the new address in the set"
        )
        # within refresh + jitter (+ a generous allowance for a loaded machine)
        assert loop.time() - changed < 0.2 + 0.1 + 2.0
        assert f"{old.host}:{port}" not in addresses(app)
        assert metric(app, "sidecar_upstream_endpoints", upstream="u", state="draining") == 1
        hits_before = old.hits
        answers = await get_many(http, url(app), 30, at_once=6)
        assert answers == [(200, "ok\n")] * 30
        assert old.hits == hits_before  # nothing new to the address that left, its idle connections unused
        assert new.hits > 0
        # the request in flight there finishes normally
        old.hold.set()
        assert await in_flight == [(200, "ok\n")]
        await until(lambda: old.open_connections == 0, "the old address's connections closed")
        await until(
            lambda: metric(app, "sidecar_upstream_endpoints", upstream="u", state="draining") == 0, "drained"
        )
        await get_many(http, url(app), 10, at_once=5)
        assert old.hits == hits_before and old.open_connections == 0


async def test_a_failed_resolution_keeps_the_last_good_set(
    dns: DnsServer, trio: list[FaultyUpstream], http: aiohttp.ClientSession
) -> None:
    port = trio[0].port
    await dns.set("orders.test", [trio[0].host, trio[1].host])
    async with running(sidecar_config(dns, [f"orders.test:{port}"])) as app:
        await dns.stop()  # queries time out now
        errors = resolutions(app, "error")
        await until(lambda: resolutions(app, "error") >= errors + 2, "resolutions failing")
        assert sorted(addresses(app)) == sorted([trio[0].endpoint, trio[1].endpoint])
        answers = await get_many(http, url(app), 20, at_once=4)
        assert answers == [(200, "ok\n")] * 20
        assert trio[0].hits > 0 and trio[1].hits > 0
        async with http.get(admin(app) + "/config") as r:
            (target,) = (await r.json())["discovery"]["u"]["targets"]
        assert target["result"] == "error" and "no answer to A within 0.3s" in target["detail"]
        assert target["addresses"] == addresses(app)
        # the server is back, with another answer: the set follows
        await dns.set("orders.test", [trio[2].host])
        await dns.start()
        await until(lambda: addresses(app) == [trio[2].endpoint], "the new answer applied")


async def test_no_address_is_answered_503_at_once_until_the_name_appears(
    dns: DnsServer, trio: list[FaultyUpstream], http: aiohttp.ClientSession
) -> None:
    port = trio[0].port
    # NXDOMAIN at start: the sidecar starts, and is ready (the name resolved, to nothing)
    async with running(sidecar_config(dns, [f"orders.test:{port}"])) as app:
        async with http.get(admin(app) + "/readyz") as r:
            assert r.status == 200
        assert resolutions(app, "empty") >= 1
        async with http.get(url(app)) as r:
            assert r.status == 503
            assert await r.text() == "retry-sidecar: no healthy upstream: 'u' has no endpoint\n"
        assert metric(app, "sidecar_attempts_total") == 0
        await dns.set("orders.test", [trio[1].host])
        await until(lambda: addresses(app) == [trio[1].endpoint], "the name resolved")
        assert await get_many(http, url(app), 5, at_once=5) == [(200, "ok\n")] * 5
        # and when the name goes away again (NXDOMAIN), the set empties: 503 at once, never a wait
        await dns.set("orders.test", [])
        await until(lambda: addresses(app) == [], "the set emptied")
        async with http.get(url(app)) as r:
            assert r.status == 503


async def test_dns_down_at_start_the_sidecar_starts_and_is_ready_once_it_tried(
    http: aiohttp.ClientSession,
) -> None:
    server = DnsServer()  # never started: its port is silent, queries time out
    cfg = sidecar_config(server, ["orders.test:8080"])
    cfg["resolver"]["timeout"] = "2s"
    from sidecar.app import App
    from sidecar.config import load_dict

    app = App(load_dict(cfg, {}))
    starting = asyncio.ensure_future(app.start())
    try:
        await until(
            lambda: app.admin is not None and app.admin.address[1] != 0 and app.listeners[0].serving,
            "admin up",
        )
        async with http.get(admin(app) + "/readyz") as r:
            assert (
                r.status == 503
            )  # the admin port answers at once; not ready while the name is being resolved
        await starting
        async with http.get(admin(app) + "/readyz") as r:
            assert r.status == 200  # resolved once (it failed): ready, and tried again on failure_refresh
        assert resolutions(app, "error") >= 1
        async with http.get(url(app)) as r:
            assert r.status == 503 and "no healthy upstream" in await r.text()
    finally:
        await app.stop(0)


async def test_srv_targets_and_their_ports_are_endpoints(dns: DnsServer, http: aiohttp.ClientSession) -> None:
    async def make(host: str, port: int) -> FaultyUpstream:
        return await FaultyUpstream(host=host).start(0)

    a, b, c = await on_one_port(make)
    await dns.set("a.test", [a.host])
    await dns.set("b.test", [b.host])
    await dns.set("c.test", [c.host])
    await dns.set_srv(
        [("_http._tcp.search.test", "a.test", a.port), ("_http._tcp.search.test", "b.test", b.port)]
    )
    try:
        async with running(sidecar_config(dns, ["srv:_http._tcp.search.test"])) as app:
            assert sorted(addresses(app)) == sorted([a.endpoint, b.endpoint])
            answers = await get_many(http, url(app), 20, at_once=4)
            assert answers == [(200, "ok\n")] * 20 and a.hits > 0 and b.hits > 0
            assert {s.headers["Host"] for s in a.received} == {f"a.test:{a.port}"}
            await dns.set_srv([("_http._tcp.search.test", "c.test", c.port)])
            await until(lambda: addresses(app) == [c.endpoint], "the new SRV answer applied")
            before = (a.hits, b.hits)
            await get_many(http, url(app), 5, at_once=5)
            assert (a.hits, b.hits) == before and c.hits == 5
    finally:
        for u in (a, b, c):
            await u.stop()


async def test_a_name_from_etc_hosts_works_as_before(dns: DnsServer, http: aiohttp.ClientSession) -> None:
    # on 127.0.0.1; dnsmasq knows nothing of localhost: /etc/hosts answers, as the system resolver's would
    async with FaultyUpstream() as up, running(sidecar_config(dns, [f"localhost:{up.port}"])) as app:
        assert addresses(app) == [f"localhost:{up.port}"]
        assert await get_many(http, url(app), 3, at_once=3) == [(200, "ok\n")] * 3
        assert {s.headers["Host"] for s in up.received} == {f"localhost:{up.port}"}
        assert resolutions(app, "ok") >= 1


async def test_config_and_metrics_show_what_was_resolved(
    dns: DnsServer, trio: list[FaultyUpstream], http: aiohttp.ClientSession
) -> None:
    port = trio[0].port
    await dns.set("orders.test", [trio[0].host, trio[1].host])
    cfg = sidecar_config(dns, [f"orders.test:{port}", f"{trio[2].host}:{port}"])
    async with running(cfg) as app:
        async with http.get(admin(app) + "/config") as r:
            shown = await r.json()
        assert shown["upstreams"]["u"]["dns"] == {
            **DNS,
            "respect_ttl": False,
            "failure_refresh": "200ms",
            "family": "auto",
        }
        view = shown["discovery"]["u"]
        name, static = view["targets"]
        assert (name["endpoint"], name["kind"], name["result"], name["family"]) == (
            f"orders.test:{port}",
            "dns",
            "ok",
            "auto",
        )
        assert sorted(name["addresses"]) == sorted([trio[0].endpoint, trio[1].endpoint])
        assert name["last_resolved"].endswith("+00:00") and name["ttl"] == 1.0
        assert static == {"endpoint": trio[2].endpoint, "kind": "static"}
        assert sorted((e["address"], e["name"], e["state"]) for e in view["endpoints"]) == [
            (trio[0].endpoint, f"orders.test:{port}", "active"),
            (trio[1].endpoint, f"orders.test:{port}", "active"),
            (trio[2].endpoint, trio[2].endpoint, "active"),
        ]
        async with http.get(admin(app) + "/metrics") as r:
            text = await r.text()
        assert 'sidecar_upstream_endpoints{state="active",upstream="u"} 3.0' in text
        assert f'sidecar_dns_resolutions_total{{name="orders.test:{port}",result="ok",upstream="u"}}' in text
        assert f'sidecar_dns_last_success_timestamp_seconds{{name="orders.test:{port}",upstream="u"}}' in text
        # per-endpoint labels are addresses, never the name
        assert f'sidecar_endpoint_ejected{{endpoint="{trio[0].endpoint}",upstream="u"}} 0.0' in text
        assert 'endpoint="orders.test' not in text


async def test_concurrency_tickets_are_per_address_and_go_with_a_drained_one(
    dns: DnsServer, trio: list[FaultyUpstream], http: aiohttp.ClientSession
) -> None:
    old, stays, new = trio
    port = old.port
    await dns.set("orders.test", [old.host, stays.host])
    concurrency = {"concurrency": {"mode": "fixed", "initial": 8}}
    async with running(sidecar_config(dns, [f"orders.test:{port}"], upstream=concurrency)) as app:
        assert await get_many(http, url(app), 12, at_once=4) == [(200, "ok\n")] * 12

        def limits() -> dict[str, float]:
            return {
                e: metric(app, "sidecar_concurrency_limit", upstream="u", endpoint=e)
                for e in (old.endpoint, stays.endpoint, new.endpoint)
            }

        assert limits() == {old.endpoint: 8, stays.endpoint: 8, new.endpoint: 0}  # its read + write pools
        await dns.set("orders.test", [stays.host, new.host])
        await until(
            lambda: sorted(addresses(app)) == sorted([stays.endpoint, new.endpoint]), "the new answer"
        )
        assert await get_many(http, url(app), 12, at_once=4) == [(200, "ok\n")] * 12
        cc = app.services.upstream("u").concurrency
        assert cc is not None and sorted(cc.endpoints) == sorted([stays.endpoint, new.endpoint])


async def test_a_name_from_the_environment_stays_hidden_in_config(
    dns: DnsServer, trio: list[FaultyUpstream], http: aiohttp.ClientSession
) -> None:
    from sidecar.app import App
    from sidecar.config import load_dict

    port = trio[0].port
    await dns.set("secret-orders.test", [trio[0].host])
    cfg = sidecar_config(dns, ["${ORDERS_HOST}:" + str(port)])
    async with App(load_dict(cfg, {"ORDERS_HOST": "secret-orders.test"})) as app:
        assert addresses(app) == [trio[0].endpoint]
        async with http.get(admin(app) + "/config") as r:
            text = await r.text()
        assert "secret-orders" not in text and "<redacted>" in text
        assert trio[0].endpoint in text  # the address it resolved to is no secret
