"""Route and absolute-form matching (no sockets)."""

from __future__ import annotations

from sidecar.adapters.http.routing import Router, Target, split_host
from sidecar.config import load_dict


def router(routes: list[dict], **listener: object) -> Router:
    cfg = load_dict(
        {
            "upstreams": {
                "api": {"endpoints": ["10.0.0.1:8080", "10.0.0.2:8080"]},
                "users": {"endpoints": ["users.svc:9000"]},
                "admin": {"endpoints": ["[::1]:7000"]},
            },
            "policies": {"slow": {"extends": "http-default"}},
            "listeners": [
                {
                    "name": "web",
                    "protocol": "http",
                    "listen": "127.0.0.1:0",
                    "upstream": "api",
                    "routes": routes,
                    **listener,
                }
            ],
        },
        {},
    )
    return Router(cfg.listeners[0], cfg.upstreams)


def test_split_host() -> None:
    assert split_host("Orders.Internal:8080") == ("orders.internal", 8080)
    assert split_host("orders") == ("orders", None)
    assert split_host("[::1]:80") == ("::1", 80)
    assert split_host("::1") == ("::1", None)
    assert split_host("example.com.") == ("example.com", None)
    assert split_host("x:notaport") == ("x", None)


def test_first_matching_route_wins_and_the_listener_is_the_fallback() -> None:
    r = router(
        [
            {"match": {"path_prefix": "/users", "host": "a.example"}, "upstream": "users"},
            {"match": {"path_prefix": "/users"}, "upstream": "admin", "policy": "slow"},
            {"match": {"host": "*.example:8443"}, "upstream": "users", "retry_non_idempotent": True},
        ]
    )
    assert r.route("a.example", "/users/1").upstream == "users"
    assert r.route("b.example", "/users/1") == Target("admin", "slow", None, 1)
    assert r.route("x.example:8443", "/") == Target("users", "http-default", True, 2)
    assert r.route("x.example:80", "/").route is None  # the port must match when the route names one
    assert r.route("example:8443", "/").route is None  # "*." needs a subdomain
    assert r.route(None, "/other") == Target("api", "http-default", None, None)


def test_listener_retry_non_idempotent_is_inherited_unless_the_route_says() -> None:
    r = router(
        [{"match": {"path_prefix": "/a"}}, {"match": {"path_prefix": "/b"}, "retry_non_idempotent": False}],
        retry_non_idempotent=True,
    )
    assert r.route(None, "/a").retry_non_idempotent is True
    assert r.route(None, "/b").retry_non_idempotent is False
    assert r.route(None, "/c").retry_non_idempotent is True


def test_absolute_form_by_upstream_name_or_endpoint_and_nothing_else() -> None:
    r = router([{"match": {"path_prefix": "/v2"}, "upstream": "users", "policy": "slow"}])
    assert r.proxy("API", 80, "/x") == Target("api", "http-default", None, None)
    assert r.proxy("10.0.0.2", 8080, "/x").upstream == "api"
    assert r.proxy("users.svc", 9000, "/v2/x") == Target("users", "slow", None, 0)  # its route applies
    assert r.proxy("users", 80, "/x") == Target("users", "http-default", None)
    assert r.proxy("::1", 7000, "/").upstream == "admin"
    assert r.proxy("10.0.0.2", 9999, "/x") is None  # not an endpoint
    assert r.proxy("example.com", 80, "/") is None


def test_a_loopback_endpoint_is_reached_by_any_loopback_name() -> None:
    r = router([])
    for host in ("localhost", "LOCALHOST", "127.0.0.1", "::1", "[::1]"):
        found = r.proxy(host, 7000, "/")
        assert found is not None and found.upstream == "admin", host
    assert r.proxy("localhost", 7001, "/") is None  # the port still has to match
    assert r.proxy("USERS.SVC", 9000, "/") is not None
