"""gRPC upstreams by name: one channel per address (the sidecar, not grpc's resolver, chooses the address of
every call), with the name as the authority (TLS verifies it); overload and dead addresses steered around;
a replaced address drains and its channel closes; no address is UNAVAILABLE at once. grpcio clients,
GrpcUpstream servers on 127.0.0.2-4, dnsmasq."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from sidecar.testing.dns_server import DnsServer
from sidecar.testing.grpc_upstream import GrpcUpstream, Step, fail
from tests.metrics import metric, until

from ..tls import server_certificate
from .conftest import HOSTS, addresses, connections_to, on_one_port, resolutions, running, sidecar_config

pytestmark = pytest.mark.timeout(60)
METHOD = "/pkg.Svc/Get"


async def upstreams(
    default: Step | None = None, tls: tuple[bytes, bytes] | None = None
) -> list[GrpcUpstream]:
    async def make(host: str, port: int) -> GrpcUpstream:
        return await GrpcUpstream(default, host=host, port=port, tls=tls).start()

    return await on_one_port(make)


@pytest.fixture
async def trio() -> AsyncIterator[list[GrpcUpstream]]:
    ups = await upstreams()
    yield ups
    for u in ups:
        await u.stop()


async def calls(app, n: int, at_once: int) -> list[grpc.StatusCode]:  # noqa: ANN001
    """``n`` unary calls through the sidecar, ``at_once`` at a time, on one client channel: their codes."""
    host, port = app.address("l")
    sem = asyncio.Semaphore(at_once)
    async with grpc.aio.insecure_channel(f"{host}:{port}", options=(("grpc.enable_retries", 0),)) as ch:
        mc = ch.unary_unary(METHOD)

        async def one() -> grpc.StatusCode:
            async with sem:
                try:
                    await mc(b"hello", timeout=10)
                except grpc.aio.AioRpcError as e:
                    return e.code()
                return grpc.StatusCode.OK

        return list(await asyncio.gather(*(one() for _ in range(n))))


def grpc_config(dns: DnsServer, endpoint: str, **kw) -> dict:  # noqa: ANN003
    return sidecar_config(dns, [endpoint], protocol="grpc", **kw)


async def test_calls_spread_over_every_address_of_a_dns_name(
    dns: DnsServer, trio: list[GrpcUpstream]
) -> None:
    port = trio[0].port
    await dns.set("shards.test", list(HOSTS))
    async with running(grpc_config(dns, f"dns:///shards.test:{port}")) as app:
        assert await calls(app, 30, at_once=6) == [grpc.StatusCode.OK] * 30
        counts = [u.count for u in trio]
        assert sum(counts) == 30 and min(counts) >= 3, counts
        assert sorted(addresses(app)) == sorted(f"{h}:{port}" for h in HOSTS)
        # one channel (one connection) per address
        assert [connections_to(f"{h}:{port}") for h in HOSTS] == [1, 1, 1]


async def test_an_overloaded_address_and_a_dead_one_are_steered_around(dns: DnsServer) -> None:
    exhausted, dead, healthy = ups = await upstreams()
    exhausted.default = fail(grpc.StatusCode.RESOURCE_EXHAUSTED)
    await dead.stop()
    port = healthy.port
    await dns.set("shards.test", list(HOSTS))
    try:
        # RESOURCE_EXHAUSTED retried (grpc-a6 passes it on): elsewhere, as the overloaded address is avoided
        retry_on = ["connect-failure", "reset", "unavailable", "overloaded"]
        async with running(grpc_config(dns, f"shards.test:{port}", policy={"retry_on": retry_on})) as app:
            codes = await calls(app, 30, at_once=6)
            assert codes == [grpc.StatusCode.OK] * 30, Counter(
                codes
            )  # was 0 of 30 with the name as one endpoint
            assert healthy.count >= 30
            assert metric(app, "sidecar_attempts_total", outcome="overloaded") >= 1
    finally:
        for u in ups:
            await u.stop()


async def test_an_address_replaced_in_dns_drains_and_its_channel_closes(
    dns: DnsServer, trio: list[GrpcUpstream]
) -> None:
    old, stays, new = trio
    port = old.port
    await dns.set("shards.test", [old.host, stays.host])
    async with running(grpc_config(dns, f"shards.test:{port}")) as app:
        assert await calls(app, 10, at_once=2) == [grpc.StatusCode.OK] * 10
        assert old.count > 0 and connections_to(old.endpoint) == 1
        # one call held at the old address when it leaves the answer
        release = asyncio.Event()
        old.default = Step(hold=release)
        in_flight = None
        while in_flight is None:
            task = asyncio.ensure_future(calls(app, 1, 1))
            there = asyncio.ensure_future(old.wait_in_flight(1))
            done, _ = await asyncio.wait({task, there}, return_when=asyncio.FIRST_COMPLETED)
            if there in done:
                in_flight = task
            else:
                there.cancel()
        await dns.set("shards.test", [stays.host, new.host])
        await until(
            lambda: sorted(addresses(app)) == sorted([stays.endpoint, new.endpoint]), "the new answer"
        )
        count = old.count
        assert await calls(app, 20, at_once=4) == [grpc.StatusCode.OK] * 20
        assert old.count == count and new.count > 0
        assert connections_to(old.endpoint) == 1  # its call in flight goes on over its channel
        release.set()
        assert await in_flight == [grpc.StatusCode.OK]
        await until(lambda: connections_to(old.endpoint) == 0, "the old address's channel closed")
        assert metric(app, "sidecar_upstream_endpoints", upstream="u", state="draining") == 0


async def test_the_name_is_the_authority_tls_verifies(dns: DnsServer, tmp_path: Path) -> None:
    cert, key = server_certificate(tmp_path, "shards.test", "DNS:shards.test")  # valid for the name only
    ups = await upstreams(tls=(key.read_bytes(), cert.read_bytes()))
    port = ups[0].port
    await dns.set("shards.test", list(HOSTS))
    try:
        cfg = grpc_config(dns, f"shards.test:{port}", upstream={"tls": {"ca_file": str(cert)}})
        async with running(cfg) as app:
            assert await calls(app, 12, at_once=4) == [grpc.StatusCode.OK] * 12
            assert all(u.count > 0 for u in ups)  # each address's channel verified the name
    finally:
        for u in ups:
            await u.stop()


async def test_no_address_is_unavailable_at_once(dns: DnsServer, trio: list[GrpcUpstream]) -> None:
    async with running(grpc_config(dns, f"dns:///shards.test:{trio[0].port}")) as app:
        host, port = app.address("l")
        async with grpc.aio.insecure_channel(f"{host}:{port}") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await ch.unary_unary(METHOD)(b"x", timeout=10)
        assert e.value.code() is grpc.StatusCode.UNAVAILABLE
        assert e.value.details() == "sidecar: upstream 'u' has no endpoint"
        assert sum(u.count for u in trio) == 0


async def test_a_failed_resolution_keeps_the_last_good_set(dns: DnsServer, trio: list[GrpcUpstream]) -> None:
    port = trio[0].port
    await dns.set("shards.test", [trio[0].host, trio[1].host])
    async with running(grpc_config(dns, f"shards.test:{port}")) as app:
        await dns.stop()  # queries time out now
        errors = resolutions(app, "error")
        await until(lambda: resolutions(app, "error") >= errors + 2, "resolutions failing")
        assert sorted(addresses(app)) == sorted([trio[0].endpoint, trio[1].endpoint])
        assert await calls(app, 12, at_once=4) == [grpc.StatusCode.OK] * 12
        assert trio[0].count > 0 and trio[1].count > 0


async def test_nxdomain_at_start_then_the_name_appears(dns: DnsServer, trio: list[GrpcUpstream]) -> None:
    async with running(grpc_config(dns, f"shards.test:{trio[0].port}")) as app:
        assert await calls(app, 3, at_once=3) == [grpc.StatusCode.UNAVAILABLE] * 3
        await dns.set("shards.test", [trio[2].host])
        await until(lambda: addresses(app) == [trio[2].endpoint], "the name resolved")
        assert await calls(app, 6, at_once=3) == [grpc.StatusCode.OK] * 6
        assert trio[2].count == 6


async def test_srv_targets_and_their_ports_are_endpoints(dns: DnsServer) -> None:
    async def make(host: str, port: int) -> GrpcUpstream:
        return await GrpcUpstream(host=host).start()  # each on a port of its own

    a, b, c = await on_one_port(make)
    for name, up in (("a.test", a), ("b.test", b), ("c.test", c)):
        await dns.set(name, [up.host])
    await dns.set_srv(
        [("_grpc._tcp.shards.test", "a.test", a.port), ("_grpc._tcp.shards.test", "b.test", b.port)]
    )
    try:
        async with running(grpc_config(dns, "srv:_grpc._tcp.shards.test")) as app:
            assert sorted(addresses(app)) == sorted([a.endpoint, b.endpoint])
            assert await calls(app, 12, at_once=4) == [grpc.StatusCode.OK] * 12
            assert a.count > 0 and b.count > 0
            await dns.set_srv([("_grpc._tcp.shards.test", "c.test", c.port)])
            await until(lambda: addresses(app) == [c.endpoint], "the new SRV answer applied")
            assert await calls(app, 4, at_once=2) == [grpc.StatusCode.OK] * 4 and c.count == 4
            await until(
                lambda: connections_to(a.endpoint) == connections_to(b.endpoint) == 0, "channels closed"
            )
    finally:
        for u in (a, b, c):
            await u.stop()
