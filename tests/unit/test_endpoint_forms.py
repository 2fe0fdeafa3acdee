"""Endpoint forms (``sidecar/upstream/target.py``) and the ``resolver:`` / ``dns:`` settings: what each form
means, and every misuse an error that names its key."""

from __future__ import annotations

import pytest

from sidecar.config import ConfigError, effective, load_text
from sidecar.upstream.target import NAME, SRV, STATIC, Target, parse


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.1.2.3:8080", Target("10.1.2.3:8080", STATIC, "10.1.2.3", 8080)),
        ("[2001:db8::1]:8080", Target("[2001:db8::1]:8080", STATIC, "2001:db8::1", 8080)),
        (
            "Orders.Prod.svc.cluster.local.:8080",
            Target("Orders.Prod.svc.cluster.local.:8080", NAME, "orders.prod.svc.cluster.local", 8080),
        ),
        ("localhost:9000", Target("localhost:9000", NAME, "localhost", 9000)),
        ("dns:///shards.prod:50051", Target("dns:///shards.prod:50051", NAME, "shards.prod", 50051, "dns")),
        ("dns:shards.prod:50051", Target("dns:shards.prod:50051", NAME, "shards.prod", 50051, "dns")),
        ("dns:///10.0.0.7:50051", Target("dns:///10.0.0.7:50051", STATIC, "10.0.0.7", 50051, "dns")),
        (
            "srv:_http._tcp.search.prod",
            Target("srv:_http._tcp.search.prod", SRV, "_http._tcp.search.prod", 0, "srv"),
        ),
        ("dns:8080", Target("dns:8080", NAME, "dns", 8080)),  # a host named dns, not a scheme
        (" orders:80 ", Target("orders:80", NAME, "orders", 80)),
    ],
)
def test_each_form_means_one_thing(text: str, expected: Target) -> None:
    assert parse(text) == expected


def test_a_target_is_named_in_logs_as_host_port_or_its_srv_name() -> None:
    assert parse("dns:///Shards.prod:50051").name == "shards.prod:50051"
    assert parse("[::1]:80").name == "[::1]:80"
    assert parse("srv:_h._tcp.x").name == "_h._tcp.x"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("https://orders:443", "https:// endpoints are not supported"),
        ("http://orders", "http:// endpoints are not supported"),
        (
            "dns://8.8.8.8/orders:80",
            "a DNS server in the endpoint (dns://8.8.8.8/) is not supported: set resolver.nameservers",
        ),
        ("dns:///orders", "needs a port (gRPC's default 443 is not assumed)"),
        ("srv:_h._tcp.x:80", "an SRV name has no port"),
        ("srv://x", "write srv:_service._proto.name"),
        ("orders", "has no port"),
        ("::1:80", "write IPv6 addresses as [addr]:port"),
        ("[orders]:80", "brackets hold an IPv6 address, not a name"),
        ("orders/x:80", "is neither an IP address nor a DNS name"),
        ("10.0.0.300:80", "is not an IP address (nor a name: its last label is a number)"),
        ("-bad.example:80", "is neither an IP address nor a DNS name"),
        ("user:pw@orders:80", "without user@"),
        ("orders:99999", "port must be a number from 0 to 65535"),
        ("", "cannot be empty"),
    ],
)
def test_a_malformed_endpoint_is_refused_saying_why(text: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        parse(text)
    assert message in str(e.value)


def errors_of(text: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as e:
        load_text(text, {})
    return e.value.errors


def test_endpoint_errors_name_their_path() -> None:
    errors = errors_of('upstreams: {orders: {endpoints: ["orders:80", "https://orders"]}}')
    assert errors == [
        (
            "upstreams.orders.endpoints[1]",
            "'https://orders': https:// endpoints are not supported; write host:port, dns:///name:port or "
            "srv:_service._proto.name",
        )
    ]


def test_an_upstream_with_a_name_shows_its_dns_settings_spelled_out() -> None:
    cfg = load_text(
        """
upstreams:
  orders: {endpoints: ["orders.prod:8080"]}
  fast: {endpoints: ["srv:_h._tcp.fast.prod"], dns: {refresh: 500ms}}
  fixed: {endpoints: ["10.0.0.1:80"]}
""",
        {},
    )
    shown = effective(cfg)
    assert shown["upstreams"]["orders"]["dns"] == {
        "refresh": "5s",
        "respect_ttl": False,
        "failure_refresh": "1s",
        "jitter": "1s",
        "family": "auto",
    }
    # failure_refresh follows a shorter refresh; an upstream of IP literals has nothing to resolve
    assert shown["upstreams"]["fast"]["dns"]["failure_refresh"] == "500ms"
    assert shown["upstreams"]["fixed"]["dns"] is None
    assert shown["resolver"] == {"nameservers": None, "timeout": "2s"}


def test_dns_and_resolver_errors_name_their_key() -> None:
    errors = errors_of(
        """
resolver: {nameservers: ["dns.google", "127.0.0.1:0", "10.0.0.53", "[::1]:5353"], timeout: 0s}
upstreams:
  a: {endpoints: ["a.prod:80"], dns: {refresh: 10ms, jitter: none, family: v5}}
  b: {endpoints: ["b.prod:80"], dns: {refresh: 2s, failure_refresh: 5s}}
  c: {endpoints: ["10.0.0.1:80"], dns: {}}
"""
    )
    assert dict(errors) == {
        "resolver.nameservers[0]": "'dns.google': a nameserver is an IP address (with :port when not 53), not a name",
        "resolver.nameservers[1]": "'127.0.0.1:0': port 0 is not a nameserver's port",
        "resolver.timeout": "timeout must be positive and finite",
        "upstreams.a.dns.refresh": "must be at least 100ms and finite",
        "upstreams.a.dns.jitter": "'none' is not a duration: use a number with ms, s, m or h (250ms, 2s, 1m)",
        "upstreams.a.dns.family": "Input should be 'auto', 'v4' or 'v6'",
        "upstreams.b.dns": "failure_refresh must not exceed refresh",
        "upstreams.c.dns": "no endpoint of this upstream is a name (all are IP addresses): nothing to resolve",
    }


def test_a_nameserver_is_written_with_or_without_its_port() -> None:
    cfg = load_text('resolver: {nameservers: ["10.0.0.53", "[::1]:5353", "::1"]}', {})
    assert cfg.resolver.nameservers == ["10.0.0.53:53", "[::1]:5353", "[::1]:53"]


def test_a_mongodb_upstream_keeps_host_port_members_resolved_by_its_connections() -> None:
    mongo = '\nlisteners: [{name: db, protocol: mongodb, listen: "127.0.0.1:27018", upstream: db}]'
    cfg = load_text('upstreams: {db: {endpoints: ["db-0.prod:27017", "10.0.0.2:27017"]}}' + mongo, {})
    assert cfg.upstreams["db"].dns is None  # a driver's connection resolves the members, as before
    assert cfg.discovered_upstreams() == set()
    errors = errors_of(
        'upstreams: {db: {endpoints: ["srv:_mongodb._tcp.db", "dns:///db-0:27017"], dns: {}}}' + mongo
    )
    assert dict(errors) == {
        "upstreams.db.endpoints[0]": "'srv:_mongodb._tcp.db': a MongoDB upstream's members are written host:port "
        "(resolved by each connection, as by a driver)",
        "upstreams.db.endpoints[1]": "'dns:///db-0:27017': a MongoDB upstream's members are written host:port "
        "(resolved by each connection, as by a driver)",
        "upstreams.db.dns": "does nothing for an upstream used by mongodb listeners (listeners[0]): a MongoDB "
        "upstream's members are resolved by each connection (as by a driver), not polled",
    }


def test_an_upstream_used_by_http_and_mongodb_listeners_is_resolved_for_http() -> None:
    cfg = load_text(
        """
upstreams: {both: {endpoints: ["both.prod:8080"]}, unused: {endpoints: ["u.prod:80"]}}
listeners:
  - {name: db, protocol: mongodb, listen: "127.0.0.1:27018", upstream: both}
  - {name: web, protocol: http, listen: "127.0.0.1:15001", upstream: both}
""",
        {},
    )
    # every upstream an HTTP client could reach (absolute-form requests reach any by name) is resolved
    assert cfg.discovered_upstreams() == {"both", "unused"}
