"""A reload keeps the state of the addresses that remain (ejection, outstanding attempts, the names being
followed), resolves the names it adds before they take over, and drains the addresses it removes."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
import yaml

from sidecar.app import App
from sidecar.config import load_file
from sidecar.testing.dns_server import DnsServer
from sidecar.testing.http_upstream import FaultyUpstream
from tests.metrics import metric, until

from .conftest import addresses, get_many, on_one_port, resolutions, sidecar_config, url

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def trio() -> list[FaultyUpstream]:
    async def make(host: str, port: int) -> FaultyUpstream:
        return await FaultyUpstream(host=host).start(port)

    ups = await on_one_port(make)
    yield ups
    for u in ups:
        await u.stop()


async def test_a_reload_keeps_the_state_of_the_addresses_that_remain(
    dns: DnsServer, trio: list[FaultyUpstream], tmp_path: Path
) -> None:
    a, dead, c = trio
    port = a.port
    await dead.stop()
    await dns.set("orders.test", [a.host, dead.host])
    cfg = sidecar_config(dns, [f"orders.test:{port}"], admin=False)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    async with App(load_file(path), config_path=path) as app, aiohttp.ClientSession() as http:
        await get_many(http, url(app), 12, at_once=3)
        ejected = {"upstream": "u", "endpoint": dead.endpoint}
        assert metric(app, "sidecar_endpoint_ejected", **ejected) == 1
        balancer = app.services.upstream("u").balancer
        resolved = resolutions(app, "ok")

        # another setting of the same upstream, and a second name
        await dns.set("more.test", [c.host])
        cfg["upstreams"]["u"]["overload_cooldown"] = "1s"
        cfg["upstreams"]["u"]["endpoints"].append(f"more.test:{port}")
        path.write_text(yaml.safe_dump(cfg))
        assert await app.reload()
        runtime = app.services.upstream("u")
        assert runtime.balancer is balancer and balancer.cooldown == 1.0
        assert metric(app, "sidecar_endpoint_ejected", **ejected) == 1  # still out of the rotation
        # the name it kept was not resolved anew to take over; the one it added was, before it took over
        assert sorted(addresses(app)) == sorted([a.endpoint, dead.endpoint, c.endpoint])
        assert resolutions(app, "ok") >= resolved
        answers = await get_many(http, url(app), 12, at_once=3)
        assert answers == [(200, "ok\n")] * 12 and c.hits > 0

        # the name removed: its addresses drain, their connections close
        cfg["upstreams"]["u"]["endpoints"] = [f"more.test:{port}"]
        path.write_text(yaml.safe_dump(cfg))
        assert await app.reload()
        assert addresses(app) == [c.endpoint]
        hits = a.hits
        await get_many(http, url(app), 6, at_once=3)
        assert a.hits == hits
        await until(lambda: a.open_connections == 0, "the removed address's connections closed")


async def test_a_reload_that_only_changes_the_resolver_asks_the_new_one(
    dns: DnsServer, trio: list[FaultyUpstream], tmp_path: Path
) -> None:
    port = trio[0].port
    await dns.set("orders.test", [trio[0].host])
    async with DnsServer(ttl=1) as other:
        await other.set("orders.test", [trio[1].host])
        cfg = sidecar_config(dns, [f"orders.test:{port}"], admin=False)
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        async with App(load_file(path), config_path=path) as app:
            assert addresses(app) == [trio[0].endpoint]
            cfg["resolver"]["nameservers"] = [other.address]
            path.write_text(yaml.safe_dump(cfg))
            assert await app.reload()
            await until(lambda: addresses(app) == [trio[1].endpoint], "the other server's answer")


async def test_an_upstream_a_reload_removes_is_no_longer_exported(
    dns: DnsServer, trio: list[FaultyUpstream]
) -> None:
    from sidecar.config import load_dict

    cfg = sidecar_config(dns, [trio[0].endpoint], admin=False)
    cfg["upstreams"]["u"].pop("dns")
    cfg["upstreams"]["gone"] = {"endpoints": [trio[1].endpoint]}
    async with App(load_dict(cfg, {})) as app:
        assert metric(app, "sidecar_upstream_endpoints", upstream="gone", state="active") == 1
        del cfg["upstreams"]["gone"]
        assert app.apply(load_dict(cfg, {}))
        names = {
            s.labels.get("upstream")
            for family in app.telemetry.metrics.registry.collect()
            for s in family.samples
            if s.name in ("sidecar_upstream_endpoints", "sidecar_endpoint_ejected")
        }
        assert names == {"u"}
