"""The console's JSON (/api/state, /api/series, /api/tap) over real HTTP, with real clients retrying through
the sidecar against real upstreams, one of them overloaded; who may look; the tap's privacy and arming."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from sidecar.admin.console import ARMED_FOR
from sidecar.admin.routes import AdminRequest
from sidecar.config import ConfigError, load_dict, load_text
from tests.metrics import until

from .scenario import SECRET, config, eventually, scene, sum_of


def endpoint(state: dict, upstream: str, address: str) -> dict:
    (up,) = [u for u in state["upstreams"] if u["name"] == upstream]
    (ep,) = [e for e in up["endpoints"] if e["endpoint"] == address]
    return ep


async def test_state_shows_the_overloaded_endpoint_retries_and_the_same_totals_as_metrics() -> None:
    async with scene() as s:
        await s.get("/api/tap", limit=0)  # arms the tap: the endpoints' recent outcomes are counted
        s.start_load()
        state = await eventually(
            lambda: s.get("/api/state"),
            lambda st: (
                endpoint(st, "orders", s.hot.endpoint)["state"] == "cooldown"
                and (st["traffic"][0]["last"] or {}).get("retries", 0) > 0
                and endpoint(st, "orders", s.hot.endpoint)["outcomes"].get("overloaded", 0) > 0
            ),
            "the overloaded endpoint in cooldown, retries counted",
        )
        hot = endpoint(state, "orders", s.hot.endpoint)
        assert 0 < hot["left_s"] <= 0.5
        assert hot["concurrency"]["limit"] >= 4 and hot["concurrency"]["probe"] in ("stable", "up", "down")
        assert endpoint(state, "orders", s.good[0].endpoint)["state"] == "active"
        (pair,) = state["traffic"]
        assert (pair["listener"], pair["upstream"]) == ("web", "orders")
        assert pair["last"]["retries_by_cause"]["overloaded"] > 0
        assert pair["last"]["amplification"] > 1.0
        (up,) = state["upstreams"]
        assert up["throttles"][0]["kind"] == "grpc" and up["retry_budget"]["scope"] == "local"
        assert state["config"] == {
            "generation": 1,
            "loaded_at": state["config"]["loaded_at"],
            "last_reload": None,
        }
        assert state["listeners"][0]["address"] == "{}:{}".format(*s.app.address("web"))

        await s.stop_load()
        state = await s.get("/api/state")
        m = await s.metrics()
        totals = state["traffic"][0]["totals"]
        lu = {"listener": "web", "upstream": "orders"}
        assert sum(totals["requests"].values()) == sum_of(m, "sidecar_requests_total", **lu) == s.sent > 0
        assert (
            totals["retries"]["overloaded"]
            == sum_of(m, "sidecar_retries_total", outcome="overloaded", **lu)
            > 0
        )
        for outcome, n in totals["attempts"].items():
            assert n == sum_of(m, "sidecar_attempts_total", outcome=outcome, **lu)


async def test_series_has_a_point_a_second_with_the_pairs_rates() -> None:
    async with scene() as s:
        s.start_load()
        first = await s.get("/api/series")
        doc = await eventually(
            lambda: s.get("/api/series", since=first["next"] - 1),
            lambda d: d["next"] >= first["next"] + 2,
            "two more points",
        )
        assert doc["first"] == first["next"] and len(doc["t"]) == doc["next"] - doc["first"]
        assert all(b > a for a, b in zip(doc["t"], doc["t"][1:], strict=False))
        (pair,) = doc["pairs"]
        assert max(v for v in pair["rps"] if v is not None) > 0
        assert max(v for v in pair["retries"] if v is not None) > 0
        limits = {e["endpoint"]: e["limit"] for e in doc["endpoints"]}
        assert set(limits) == {s.hot.endpoint, *(g.endpoint for g in s.good)}
        assert doc["epoch"] == first["epoch"]


async def test_the_tap_lists_requests_with_attempts_and_reasons_and_never_a_query_string() -> None:
    async with scene() as s:
        before = await s.get("/api/tap", limit=0)
        assert s.app.telemetry.tap is not None  # armed by the read
        for i in range(30):
            assert await s.request(i) == 200
        async with s.http.get(s.admin + "/api/tap", params={"since": before["next"], "limit": 1000}) as r:
            text = await r.text()
        assert SECRET not in text and "token" not in text
        doc = json.loads(text)
        assert doc["missed"] == 0 and len(doc["records"]) == 30
        routes = [r["route"] for r in doc["records"]]
        assert routes == [f"GET /orders/{i}" for i in range(30)]
        for r in doc["records"]:
            assert r["listener"] == "web" and r["upstream"] == "orders" and r["protocol"] == "http"
            assert r["reason"] == "success" and r["status"] == "200" and r["total_ms"] > 0
            assert r["attempts"][-1]["outcome"] == "success" and r["attempts"][-1]["decision"] == "success"
        retried = [r for r in doc["records"] if len(r["attempts"]) > 1]
        assert retried, "no request went to the overloaded endpoint first"
        first = retried[0]["attempts"][0]
        assert (first["endpoint"], first["outcome"], first["detail"], first["decision"]) == (
            s.hot.endpoint,
            "overloaded",
            "503",
            "retry",
        )
        second = retried[0]["attempts"][1]
        assert second["endpoint"] != s.hot.endpoint and second["start_ms"] >= first["start_ms"] + first["ms"]
        # filters
        none = await s.get("/api/tap", since=before["next"], upstream="elsewhere")
        assert none["records"] == [] and none["next"] == doc["next"]
        assert len((await s.get("/api/tap", since=before["next"], listener="web", limit=5))["records"]) == 5


async def test_a_long_poll_answers_when_a_request_ends_and_a_stop_ends_it() -> None:
    async with scene() as s:
        now = await s.get("/api/tap", limit=0)
        poll = asyncio.create_task(s.get("/api/tap", since=now["next"], wait=10))
        await until(lambda: s.app.console is not None and s.app.console._pushed is not None, "the poll waits")
        assert not poll.done()
        await s.request(1)
        doc = await poll
        assert [r["route"] for r in doc["records"]] == ["GET /orders/1"]
        poll = asyncio.create_task(s.get("/api/tap", since=doc["next"], wait=10))
        await until(lambda: s.app.console is not None and s.app.console._pushed is not None, "the poll waits")
        await s.app.stop(0)  # the admin server would wait for the poll: the console ends it first
        assert (await asyncio.wait_for(poll, 8))["records"] == []


async def test_the_tap_records_only_while_someone_reads_it() -> None:
    async with scene() as s:
        assert s.app.telemetry.tap is None
        await s.request(1)
        state = await s.get("/api/state")
        assert state["tap"] == {"armed": False, "capacity": 1024, "seq": 0}
        assert endpoint(state, "orders", s.good[0].endpoint)["outcomes"] is None  # not counted: nobody looks
        await s.get("/api/tap", limit=0)
        await s.request(2)
        assert (await s.get("/api/state"))["tap"]["seq"] == 1
        console = s.app.console
        assert console is not None
        console._read_at -= ARMED_FOR + 1  # as if the last read was longer ago: the next tick disarms
        await until(lambda: s.app.telemetry.tap is None, "the tap disarmed")
        assert len(console.tap.ring) == 0
        await s.request(3)
        assert (await s.get("/api/state"))["tap"]["seq"] == 1


async def test_the_console_answers_loopback_clients_only_unless_console_allow_says_more() -> None:
    async with scene() as s:
        assert s.app.admin is not None
        routes = s.app.admin.routes
        for path in (
            "/",
            "/api",
            "/api/state",
            "/api/series",
            "/api/tap",
            "/console.js",
            "/vendor/uPlot.iife.min.js",
        ):
            for peer in ("10.1.2.3", "192.0.2.7", "", "::ffff:10.1.2.3", "2001:db8::1"):
                r = routes[path](AdminRequest("GET", path, {}, peer))
                assert r.status == 403, (path, peer)
                assert b"admin.console_allow" in r.body
            for peer in ("127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1"):
                r = routes[path](AdminRequest("GET", path, {"limit": "0"}, peer))
                r = await r if asyncio.iscoroutine(r) else r
                assert r.status == 200, (path, peer)
        for path in ("/metrics", "/healthz", "/readyz", "/config"):  # not the console's: as before
            assert routes[path](AdminRequest("GET", path, {}, "10.1.2.3")).status == 200

        # a reload changes who may look, at once
        cfg = config([g.endpoint for g in s.good], console_allow=["10.0.0.0/8", "2001:db8::/32"])
        cfg["admin"]["listen"] = s.app.config.admin.listen
        assert s.app.apply(load_dict(cfg, {}))
        assert routes["/api/state"](AdminRequest("GET", "/api/state", {}, "10.1.2.3")).status == 200
        assert routes["/api/state"](AdminRequest("GET", "/api/state", {}, "2001:db8::1")).status == 200
        assert routes["/api/state"](AdminRequest("GET", "/api/state", {}, "192.0.2.7")).status == 403
        state = await s.get("/api/state")
        assert state["config"]["generation"] == 2 and state["config"]["last_reload"]["result"] == "applied"


def test_console_allow_takes_address_ranges_and_names_the_bad_one() -> None:
    assert load_text("admin: {console_allow: ['10.0.0.0/8', '::1']}", {}).admin.console_allow == [
        "10.0.0.0/8",
        "::1/128",
    ]
    with pytest.raises(ConfigError) as e:
        load_text("admin: {console_allow: ['10.0.0.0/8', '10.1.2.3/8', 'everyone']}", {})
    paths = [p for p, _ in e.value.errors]
    assert paths == ["admin.console_allow[1]", "admin.console_allow[2]"]


async def test_the_page_and_its_files_are_served_with_a_strict_content_security_policy() -> None:
    async with scene() as s:
        async with s.http.get(s.admin + "/") as r:
            page = await r.text()
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
            assert "script-src 'self'" in r.headers["Content-Security-Policy"]
        # everything the page loads comes from the admin port itself
        for ref in ("/vendor/uPlot.iife.min.js", "/vendor/uPlot.min.css", "/console.js", "/console.css"):
            assert f'"{ref}"' in page
            async with s.http.get(s.admin + ref) as r:
                assert r.status == 200 and len(await r.read()) > 1000
        assert "http://" not in page.replace('href="/', "") and "https://" not in page
        async with s.http.get(s.admin + "/vendor/uPlot.LICENSE") as r:
            assert "MIT License" in await r.text()
        index = await s.get("/api")
        assert set(index["endpoints"]) == {
            "/api/state",
            "/api/series?since=N",
            "/api/tap?since=SEQ&limit=N&wait=S&listener=L&upstream=U",
        }


@pytest.mark.parametrize(
    "query", [{"since": "abc"}, {"limit": "many"}, {"wait": "nan"}, {"wait": "inf"}], ids=lambda q: str(q)
)
async def test_a_bad_parameter_is_a_400_naming_it(query: dict[str, str]) -> None:
    async with scene() as s:
        (name,) = query
        async with s.http.get(s.admin + "/api/tap", params=query) as r:
            assert r.status == 400
            assert (await r.json())["error"].startswith(f"{name}: expected a number")
        async with s.http.get(s.admin + "/api/state") as r:  # nothing else is disturbed
            assert r.status == 200


async def test_a_secret_of_the_config_never_shows_in_the_tap() -> None:
    """A value the config took from the environment is a secret: where a client puts it in a path (or an
    upstream in an error), the tap shows ``<redacted>``, as /config and the log do."""
    from sidecar.app import App
    from sidecar.testing.http_upstream import FaultyUpstream

    token = "tok-3f9a1c77e2"
    async with FaultyUpstream(keep_records=False) as up:
        cfg = {
            "admin": {"listen": "127.0.0.1:0"},
            "telemetry": {"service_name": "${SERVICE_TOKEN}"},
            "upstreams": {"orders": {"endpoints": [up.endpoint]}},
            "listeners": [{"name": "web", "protocol": "http", "listen": "127.0.0.1:0", "upstream": "orders"}],
        }
        async with App(load_dict(cfg, {"SERVICE_TOKEN": token})) as app, aiohttp.ClientSession() as http:
            assert app.admin is not None
            admin = "http://{}:{}".format(*app.admin.address)
            async with http.get(admin + "/api/tap", params={"limit": "0"}) as r:
                assert r.status == 200
            host, port = app.address("web")
            async with http.get(f"http://{host}:{port}/users/{token}/orders") as r:
                assert r.status == 200
            async with http.get(admin + "/api/tap") as r:
                text = await r.text()
    assert token not in text
    assert json.loads(text)["records"][0]["route"] == "GET /users/<redacted>/orders"


async def test_the_console_answers_requests_addressed_to_an_ip_or_localhost_or_a_name_in_console_hosts() -> (
    None
):
    """DNS rebinding: a page at evil.example whose name was made to resolve to 127.0.0.1 sends its requests
    from the browser on loopback, under its own Host; the console refuses them, as it does a request with two
    Hosts. The probes and /metrics answer whatever the Host (the kubelet addresses the pod by IP)."""
    async with scene() as s:
        host, port = s.app.admin.address

        async def status(path: str, *hosts: str) -> int:
            reader, writer = await asyncio.open_connection(host, port)
            head = "".join(f"Host: {h}\r\n" for h in hosts)
            writer.write(f"GET {path} HTTP/1.1\r\n{head}Connection: close\r\n\r\n".encode())
            line = await reader.readline()
            await reader.read()
            writer.close()
            return int(line.split()[1])

        for name in (
            f"127.0.0.1:{port}",
            "127.0.0.1",
            f"[::1]:{port}",
            f"localhost:{port}",
            "LOCALHOST",
            "a.localhost",
        ):
            assert await status("/api/state", name) == 200, name
        assert await status("/api/state") == 200  # no Host at all (HTTP/1.0 tools): not a browser
        for name in (
            f"evil.example:{port}",
            "evil.example",
            "sidecar.orders.svc",
            "[not-an-address]",
            "127.0.0.1.nip.io",
        ):
            assert await status("/api/state", name) == 403, name
            assert await status("/", name) == 403, name
            assert await status("/healthz", name) == 200, name
            assert await status("/metrics", name) == 200, name
        assert await status("/api/state", "127.0.0.1", "evil.example") == 400

        # a name the console may be reached by, applied by a reload
        cfg = config([g.endpoint for g in s.good], console_hosts=["Sidecar.Orders.svc"])
        cfg["admin"]["listen"] = s.app.config.admin.listen
        assert s.app.apply(load_dict(cfg, {}))
        assert await status("/api/state", f"sidecar.orders.svc:{port}") == 200
        assert await status("/api/state", "evil.example") == 403


def test_console_hosts_takes_names_and_names_the_bad_one() -> None:
    assert load_text("admin: {console_hosts: ['Sidecar.Orders.svc.', 'pod-1']}", {}).admin.console_hosts == [
        "sidecar.orders.svc",
        "pod-1",
    ]
    with pytest.raises(ConfigError) as e:
        load_text("admin: {console_hosts: ['ok.example', 'http://x.example', 'x.example:9901']}", {})
    assert sorted(p for p, _ in e.value.errors) == ["admin.console_hosts[1]", "admin.console_hosts[2]"]
