"""TLS (rediss://) and a password to a real redis-server listening with TLS only, with a test certificate."""

from __future__ import annotations

from sidecar.testing.http_upstream import FaultyUpstream
from sidecar.testing.redis_server import RedisServer
from tests.integration.fleet.fleet_sidecars import fleet, fleet_config, link, new_prefix
from tests.integration.tls import server_certificate
from tests.metrics import metric


async def test_settles_over_tls_with_a_password(redis_binary, tmp_path):
    cert, key = server_certificate(tmp_path, "127.0.0.1", "IP:127.0.0.1")
    with RedisServer(password="s3cret pass", tls=(cert, key)) as server:
        assert server.url.startswith("rediss://")
        async with FaultyUpstream() as up:
            cfg = fleet_config(up.endpoint, server.url.replace("s3cret pass", "s3cret%20pass"), new_prefix())
            async with fleet(cfg, 1) as (app,):
                await link(app).wait_for(lambda m: m.up == 1)
                assert metric(app, "sidecar_fleet_redis_up") == 1
            # the wrong password is a failure like any other: the sidecar stands alone
            bad = fleet_config(up.endpoint, server.url.replace("s3cret pass", "wrong"), new_prefix())
            async with fleet(bad, 1) as (app,):
                await link(app).wait_for(lambda m: m.failures >= 1)
                assert link(app).member.up == 0
