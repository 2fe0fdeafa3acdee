"""Configuration: the user's contract. Good files load with presets spelled out; bad ones give every error
with the path of its key."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sidecar.config import (
    PRESETS,
    ConfigError,
    effective,
    effective_yaml,
    load_dict,
    load_file,
    load_text,
    retry_policy,
)
from sidecar.config.units import format_duration, parse_duration, parse_size
from sidecar.policy import Jitter, OutcomeClass, ThrottleKind

ROOT = Path(__file__).resolve().parents[2]
C = OutcomeClass


def errors_of(text: str, environ: dict[str, str] | None = None) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as e:
        load_text(text, environ or {})
    return e.value.errors


def paths_of(text: str, environ: dict[str, str] | None = None) -> list[str]:
    return [p for p, _ in errors_of(text, environ)]


MINIMAL = """
upstreams:
  orders: {endpoints: ["127.0.0.1:8081"]}
listeners:
  - {name: orders, protocol: http, listen: "127.0.0.1:15001", upstream: orders}
"""


def test_example_config_loads_and_compiles_to_the_documented_policy() -> None:
    cfg = load_file(ROOT / "config.example.yaml")
    p = retry_policy("default", cfg.policies["default"])
    assert p.max_attempts == 3
    assert p.retry_on == {C.CONNECT_FAILURE, C.RESET, C.UNAVAILABLE, C.OVERLOADED}
    assert (p.backoff.initial, p.backoff.max, p.backoff.multiplier, p.backoff.jitter) == (
        0.025,
        1.0,
        2.0,
        Jitter.FULL,
    )
    assert p.per_try_timeout == 2.0
    assert p.throttle is not None and p.throttle.kind is ThrottleKind.GRPC
    assert (p.throttle.max_tokens, p.throttle.token_ratio) == (10, 0.1)
    assert p.deadline == 10.0
    assert cfg.policies["default"].deadline.expired_status == 498
    assert cfg.upstreams["orders"].endpoints == ["127.0.0.1:8081", "127.0.0.1:8082"]
    assert cfg.upstreams["orders"].overload_cooldown == 5.0


def test_durations_and_sizes() -> None:
    assert parse_duration("250ms") == 0.25
    assert parse_duration("2s") == 2.0
    assert parse_duration("1m") == 60.0
    assert parse_duration("0.1s") == pytest.approx(0.1)
    assert parse_size("1MiB") == 1 << 20
    assert parse_size("256KiB") == 256 << 10
    assert parse_size(100) == 100
    assert format_duration(0.025) == "25ms"
    assert format_duration(60.0) == "1m"
    assert format_duration(math.inf) == "none"
    for bad in ("5", "fast", "2 days", "-1s"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    with pytest.raises(ValueError, match="needs a unit"):
        parse_duration(5)


def test_dangling_reference_names_the_path_and_the_known_names() -> None:
    errs = errors_of(MINIMAL.replace("upstream: orders}", "upstream: ordrs}"))
    assert errs == [("listeners[0].upstream", "no upstream named 'ordrs' (upstreams: orders)")]


def test_every_error_is_reported_at_once_with_its_path() -> None:
    text = """
policies:
  p: {max_attempts: 0, backoff: {initial: 5, jitter: weird}, retry_on: [success], colour: red}
upstreams:
  orders: {endpoints: ["localhost"]}
listeners:
  - {name: a, protocol: http, listen: "127.0.0.1:1", upstream: orders, policy: nope}
  - {name: a, protocol: smtp, listen: "127.0.0.1:1", upstream: orders}
  - {name: c, protocol: http, listen: "127.0.0.1:3", upstream: orders, routes: [{match: {}}]}
"""
    paths = paths_of(text)
    for expected in (
        "policies.p.max_attempts",
        "policies.p.backoff.initial",
        "policies.p.backoff.jitter",
        "policies.p.retry_on",
        "policies.p.colour",
        "upstreams.orders.endpoints[0]",
        "listeners[0].policy",
        "listeners[1]",
        "listeners[1].name",
        "listeners[1].listen",
        "listeners[2].routes[0].match",
    ):
        assert expected in paths, (expected, paths)


def test_unknown_keys_are_errors() -> None:
    errs = errors_of(MINIMAL + "\nadmin: {listen: '127.0.0.1:9901', port: 3}\n")
    assert ("admin.port", "unknown key") in errs


def test_yaml_syntax_error_names_the_line() -> None:
    errs = errors_of("upstreams: {orders: [\n")
    assert len(errs) == 1 and "not valid YAML" in errs[0][1] and "line" in errs[0][1]


def test_top_level_must_be_a_mapping() -> None:
    assert "mapping" in errors_of("- a\n- b\n")[0][1]


def test_environment_variables_are_expanded_and_missing_ones_named() -> None:
    text = MINIMAL.replace('"127.0.0.1:8081"', '"${ORDERS_HOST:-127.0.0.1}:${ORDERS_PORT}"')
    cfg = load_text(text, {"ORDERS_PORT": "9000"})
    assert cfg.upstreams["orders"].endpoints == ["127.0.0.1:9000"]
    assert errors_of(text) == [
        ("upstreams.orders.endpoints[0]", "environment variable 'ORDERS_PORT' is not set")
    ]


def test_secrets_are_redacted_in_the_effective_config() -> None:
    text = """
upstreams:
  db: {endpoints: ["127.0.0.1:27017"], auth: {username: app, password: "${DB_PASSWORD}"}}
listeners:
  - {name: db, protocol: mongodb, listen: "127.0.0.1:27018", upstream: db}
"""
    cfg = load_text(text, {"DB_PASSWORD": "hunter2"})
    assert cfg.upstreams["db"].auth is not None and cfg.upstreams["db"].auth.password == "hunter2"
    assert "hunter2" not in effective_yaml(cfg)
    assert effective(cfg)["upstreams"]["db"]["auth"]["password"] == "<redacted>"


def test_listener_without_policy_uses_its_protocols_preset_spelled_out() -> None:
    text = """
upstreams:
  db: {endpoints: ["127.0.0.1:27017"]}
listeners:
  - {name: db, protocol: mongodb, listen: "127.0.0.1:27018", upstream: db}
"""
    cfg = load_text(text, {})
    assert cfg.listeners[0].policy == "mongodb-backpressure"
    spelled = effective(cfg)["policies"]["mongodb-backpressure"]
    assert spelled["max_attempts"] == 6
    assert spelled["backoff"] == {"initial": "100ms", "max": "10s", "multiplier": 2.0, "jitter": "full"}
    assert spelled["backoff_on"] == ["overloaded"]
    assert spelled["throttle"]["kind"] == "mongodb" and spelled["throttle"]["capacity"] == 1000


def test_a_policy_written_with_the_presets_keys_is_the_preset() -> None:
    for name, body in PRESETS.items():
        import yaml

        text = yaml.safe_dump({"policies": {"mine": body}})
        cfg = load_text(text, {})
        spelled = load_text(
            yaml.safe_dump(
                {
                    "upstreams": {"u": {"endpoints": ["127.0.0.1:1"]}},
                    "listeners": [
                        {
                            "name": "l",
                            "protocol": "http",
                            "listen": "127.0.0.1:0",
                            "upstream": "u",
                            "policy": name,
                        }
                    ],
                }
            ),
            {},
        )
        mine = retry_policy("x", cfg.policies["mine"])
        preset = retry_policy("x", spelled.policies[name])
        assert mine == preset, name


def test_extends_overrides_some_keys_of_a_preset() -> None:
    text = """
policies:
  gentle: {extends: mongodb-backpressure, max_attempts: 3, backoff: {initial: 50ms}}
"""
    p = load_text(text, {}).policies["gentle"]
    assert p.max_attempts == 3
    assert p.backoff.initial == 0.05 and p.backoff.max == 10.0  # merged, not replaced
    assert p.throttle is not None and p.throttle.kind == "mongodb"


def test_extends_cycles_and_unknown_parents_are_errors() -> None:
    errs = errors_of("policies:\n  a: {extends: b}\n  b: {extends: a}\n  c: {extends: nope}\n")
    paths = [p for p, _ in errs]
    assert "policies.c.extends" in paths
    assert any("circular" in m for _, m in errs)


def test_throttle_kinds_have_their_own_keys() -> None:
    errs = errors_of("policies:\n  p: {throttle: {kind: mongodb, max_tokens: 10}}\n")
    assert ("policies.p.throttle.max_tokens", "unknown key") in errs
    errs = errors_of("policies:\n  p: {throttle: {kind: leaky}}\n")
    assert errs[0][0] == "policies.p.throttle"


def test_grpc_status_codes_by_name_or_number() -> None:
    p = load_text("policies:\n  p: {retryable_codes: [unavailable, 4, '8']}\n", {}).policies["p"]
    assert p.retryable_codes == ["UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"]
    assert paths_of("policies:\n  p: {retryable_codes: [SLOW]}\n") == ["policies.p.retryable_codes"]


def test_deadline_default_none_means_no_deadline() -> None:
    p = load_text("policies:\n  p: {deadline: {default: none}}\n", {}).policies["p"]
    assert retry_policy("p", p).deadline == math.inf


def test_hedging_non_fatal_defaults_to_retry_on() -> None:
    p = load_text("policies:\n  p: {retry_on: [unavailable], hedging: {max_attempts: 2, delay: 20ms}}\n", {})
    h = retry_policy("p", p.policies["p"]).hedging
    assert h is not None and h.non_fatal == {C.UNAVAILABLE} and h.delay == 0.02 and h.max_attempts == 2


def _listeners(*listens: str, admin: str | None = None) -> dict:
    return {
        "admin": {"listen": admin},
        "upstreams": {"u": {"endpoints": ["127.0.0.1:1"]}},
        "listeners": [
            {"name": f"l{i}", "protocol": "http", "listen": listen, "upstream": "u"}
            for i, listen in enumerate(listens)
        ],
    }


@pytest.mark.parametrize(
    ("listens", "admin", "clash"),
    [
        (["127.0.0.1:8080", "127.0.0.1:8080"], None, "listeners[1].listen"),
        (["0.0.0.0:8080", "127.0.0.1:8080"], None, "listeners[1].listen"),  # the wildcard holds every host
        (["127.0.0.1:8080"], "0.0.0.0:8080", "admin.listen"),
        (["127.0.0.1:0", "127.0.0.1:0"], "127.0.0.1:0", None),  # port 0: each gets a free port
        (["127.0.0.1:8080", "127.0.0.2:8080"], "127.0.0.1:8081", None),
    ],
)
def test_two_listeners_on_one_address_is_an_error_naming_both(
    listens: list[str], admin: str | None, clash: str | None
) -> None:
    if clash is None:
        load_dict(_listeners(*listens, admin=admin), {})
        return
    with pytest.raises(ConfigError) as err:
        load_dict(_listeners(*listens, admin=admin), {})
    assert clash in str(err.value) and "listeners[0]" in str(err.value)
