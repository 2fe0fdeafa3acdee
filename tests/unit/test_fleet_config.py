"""The fleet block and retry_budget in the configuration: defaults, path-named errors, the password never
printed."""

from __future__ import annotations

import pytest

from sidecar.config import ConfigError, load_dict
from sidecar.config.effective import effective_yaml

BASE = {
    "upstreams": {"orders": {"endpoints": ["127.0.0.1:8081"], "retry_budget": {"scope": "fleet"}}},
    "fleet": {"redis": {"url": "rediss://app:hunter2@redis.internal:6380/1"}},
}


def test_defaults_are_the_issue_s():
    c = load_dict(BASE, {})
    assert c.fleet is not None
    assert (c.fleet.redis.timeout, c.fleet.redis.key_prefix, c.fleet.lease, c.fleet.fallback_members) == (
        0.005,
        "retry-sidecar:",
        0.2,
        1,
    )
    rb = c.upstreams["orders"].retry_budget
    assert rb is not None and (rb.scope, rb.ratio, rb.min_per_second, rb.window) == ("fleet", 0.2, 10.0, 10.0)
    assert c.fleet.redis.url == "rediss://app:hunter2@redis.internal:6380/1"  # the sidecar itself has it


def test_effective_config_redacts_the_password():
    text = effective_yaml(load_dict(BASE, {}))
    assert "hunter2" not in text
    assert "rediss://<redacted>@redis.internal:6380/1" in text  # the one userinfo rule (config/redact.py)


def test_password_from_the_environment():
    tree = {**BASE, "fleet": {"redis": {"url": "redis://:${REDIS_PASSWORD}@127.0.0.1:6379/0"}}}
    c = load_dict(tree, {"REDIS_PASSWORD": "from-env"})
    assert c.fleet is not None and c.fleet.redis.url == "redis://:from-env@127.0.0.1:6379/0"
    assert "from-env" not in effective_yaml(c)


def errors(tree: dict) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_dict(tree, {})
    return [f"{path}: {msg}" for path, msg in e.value.errors]


def test_fleet_scope_without_a_fleet_block_names_its_path():
    tree = {"upstreams": BASE["upstreams"]}
    assert errors(tree) == ["upstreams.orders.retry_budget.scope: scope fleet needs a `fleet:` block"]


def test_bad_values_name_their_paths_and_never_echo_the_password():
    tree = {
        "upstreams": {
            "orders": {"endpoints": ["127.0.0.1:8081"], "retry_budget": {"window": "0s", "ratio": -1}}
        },
        "fleet": {"redis": {"url": "http://u:hunter2@x", "timeout": "none"}, "fallback_members": 0},
    }
    found = errors(tree)
    assert any(e.startswith("fleet.redis.url: 'http://<redacted>@x' is not a redis://") for e in found)
    assert any(e.startswith("fleet.redis.timeout:") for e in found)
    assert any(e.startswith("fleet.fallback_members:") for e in found)
    assert any(e.startswith("upstreams.orders.retry_budget.window:") for e in found)
    assert any(e.startswith("upstreams.orders.retry_budget.ratio:") for e in found)
    assert not any("hunter2" in e for e in found)
