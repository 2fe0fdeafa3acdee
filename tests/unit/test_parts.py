"""Which optional parts a config needs (``sidecar/parts.py``): the table the composition root loads from."""

from __future__ import annotations

import pytest

from sidecar import parts
from sidecar.config import load_dict


def config(**extra: object):  # noqa: ANN201
    tree: dict = {
        "admin": {"listen": None},
        "upstreams": {"web": {"endpoints": ["127.0.0.1:1"]}},
        "listeners": [{"name": "web", "protocol": "http", "listen": "127.0.0.1:0", "upstream": "web"}],
    }
    tree.update(extra)
    return load_dict(tree, {})


def test_an_http_listener_alone_needs_its_listener_only() -> None:
    assert parts.used(config()) == ["listener.http"]
    assert parts.describe(config()) == "listener.http (httptools)"


def test_each_feature_is_needed_only_when_the_config_uses_it() -> None:
    traced = config(telemetry={"traces": {"exporter": "console"}})
    assert parts.used(traced) == ["listener.http", "tracing"]
    named = config(upstreams={"web": {"endpoints": ["orders.internal:8080"]}})
    assert parts.used(named) == ["listener.http", "dns"]
    fleet = {"redis": {"url": "redis://127.0.0.1:6379/0"}}
    local = config(
        fleet=fleet, upstreams={"web": {"endpoints": ["127.0.0.1:1"], "retry_budget": {"ratio": 0.2}}}
    )
    assert "fleet" not in parts.used(local)  # a fleet block with nothing leased through it
    leased = config(
        fleet=fleet,
        upstreams={"web": {"endpoints": ["127.0.0.1:1"], "retry_budget": {"scope": "fleet", "ratio": 0.2}}},
    )
    assert "fleet" in parts.used(leased)


def test_a_part_is_loaded_by_name_and_a_name_is_registered_once() -> None:
    assert parts.load("listener.http").__name__ == "HttpListener"
    with pytest.raises(ValueError, match="already registered"):
        parts.register("tracing", parts.Part("elsewhere:Thing", lambda c: False, "nothing"))
    parts.register("tracing", parts.PARTS["tracing"])  # the same entry again is no conflict
