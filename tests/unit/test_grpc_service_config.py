"""A gRPC service config pasted into a listener: validated like gRPC does (A6), mapped onto named policies."""

from __future__ import annotations

import json
import math

import pytest

from sidecar.config import ConfigError, load_dict
from sidecar.config.grpc_service_config import ServiceConfig, parse

UP = {"u": {"endpoints": ["127.0.0.1:1"]}}


def listener(**extra: object) -> dict:
    return {
        "upstreams": UP,
        "listeners": [{"name": "g", "protocol": "grpc", "listen": "127.0.0.1:0", "upstream": "u", **extra}],
    }


RETRY = {
    "maxAttempts": 4,
    "initialBackoff": "0.1s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE", 8],
}


def errors_of(cfg: dict) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as e:
        load_dict(cfg, {})
    return e.value.errors


def test_method_configs_become_named_policies_and_method_policies() -> None:
    sc = {
        "methodConfig": [
            {"name": [{"service": "pkg.Svc", "method": "Get"}], "retryPolicy": RETRY, "timeout": "2.5s"},
            {
                "name": [{}],
                "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.05s", "nonFatalStatusCodes": [14]},
            },
        ],
        "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.5},
        "loadBalancingConfig": [{"round_robin": {}}],  # a gRPC key the sidecar ignores
    }
    cfg = load_dict(listener(service_config=json.dumps(sc), method_policies={"pkg.Svc": "grpc-a6"}), {})
    lst = cfg.listeners[0]
    assert lst.method_policies == {
        "pkg.Svc": "grpc-a6",
        "pkg.Svc/Get": "g.methodConfig[0]",
        "*": "g.methodConfig[1]",
    }
    retry = cfg.policies["g.methodConfig[0]"]
    assert retry.max_attempts == 4 and retry.hedging is None
    assert (retry.backoff.initial, retry.backoff.max, retry.backoff.multiplier) == (0.1, 1.0, 2.0)
    assert (
        retry.retryable_codes == ["UNAVAILABLE"] and "overloaded" in retry.retry_on
    )  # 8 = RESOURCE_EXHAUSTED
    assert retry.throttle is not None and retry.throttle.token_ratio == 0.5
    assert retry.deadline.default == 2.5 and retry.transparent_retry
    hedge = cfg.policies["g.methodConfig[1]"]
    assert hedge.hedging is not None and hedge.hedging.max_attempts == 3 and hedge.hedging.delay == 0.05
    assert hedge.deadline.default == math.inf


def test_max_attempts_is_clamped_to_five() -> None:
    sc = {"methodConfig": [{"name": [{"service": "a.B"}], "retryPolicy": {**RETRY, "maxAttempts": 9}}]}
    cfg = load_dict(listener(service_config=sc), {})
    assert cfg.policies["g.methodConfig[0]"].max_attempts == 5


def test_yaml_text_is_accepted() -> None:
    text = "methodConfig:\n- name: [{service: a.B}]\n  retryPolicy: {maxAttempts: 2, initialBackoff: 1s, maxBackoff: 2s, backoffMultiplier: 1, retryableStatusCodes: [unavailable]}\n"
    cfg = load_dict(listener(service_config=text), {})
    assert cfg.policies["g.methodConfig[0]"].max_attempts == 2


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        ({"maxAttempts": 1}, "retryPolicy.maxAttempts", "greater than 1"),
        ({"initialBackoff": "100ms"}, "retryPolicy.initialBackoff", "is not a duration"),
        ({"maxBackoff": "0s"}, "retryPolicy.maxBackoff", "greater than 0"),
        ({"retryableStatusCodes": ["NOPE"]}, "retryPolicy.retryableStatusCodes[0]", "not a gRPC status code"),
        ({"retryableStatusCodes": []}, "retryPolicy.retryableStatusCodes", "non-empty"),
        ({"backoffMultiplier": 0}, "retryPolicy.backoffMultiplier", "greater than 0"),
        ({"typo": 1}, "retryPolicy.typo", "unknown key"),
    ],
)
def test_invalid_retry_policies_name_their_path(change: dict, path: str, message: str) -> None:
    sc = {"methodConfig": [{"name": [{"service": "a.B"}], "retryPolicy": {**RETRY, **change}}]}
    errs = errors_of(listener(service_config=sc))
    assert any(
        p == f"listeners[0].service_config.methodConfig[0].{path}" and message in m for p, m in errs
    ), errs


def test_structural_errors() -> None:
    sc = {
        "methodConfig": [
            {
                "name": [{"service": "a"}, {"service": "a"}],
                "retryPolicy": RETRY,
                "hedgingPolicy": {"maxAttempts": 2},
            },
            {"name": [{"method": "m"}]},
        ],
        "retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1},
    }
    errs = dict(errors_of(listener(service_config=sc)))
    base = "listeners[0].service_config"
    assert "already configured" in errs[f"{base}.methodConfig[0].name[1]"]
    assert "not both" in errs[f"{base}.methodConfig[0]"]
    assert "needs its service" in errs[f"{base}.methodConfig[1].name[0]"]
    assert "greater than 0" in errs[f"{base}.retryThrottling.maxTokens"]


def test_broken_text_and_bad_method_keys() -> None:
    errs = dict(errors_of(listener(service_config="{not json", method_policies={"/a/b/c": "grpc-a6"})))
    assert "not valid JSON or YAML" in errs["listeners[0].service_config"]
    assert "package.Service" in errs['listeners[0].method_policies["/a/b/c"]']


def test_timeouts_by_method_key() -> None:
    sc = parse({"methodConfig": [{"name": [{"service": "a.B", "method": "C"}], "timeout": "0.25s"}]}, "", [])
    assert isinstance(sc, ServiceConfig) and sc.timeouts() == {"a.B/C": 0.25}


def test_the_loader_hands_the_listener_the_service_configs_timeouts_and_your_own_win() -> None:
    sc = {"methodConfig": [{"name": [{"service": "a.B"}], "timeout": "0.25s"}, {"name": [{}], "timeout": "2s"}]}
    cfg = load_dict(listener(service_config=sc, method_timeouts={"a.B": "100ms"}), {})
    assert cfg.listeners[0].method_timeouts == {"a.B": 0.1, "*": 2.0}
    errs = dict(errors_of(listener(method_timeouts={"/a/b/c": "1s"})))
    assert "package.Service" in errs['listeners[0].method_timeouts["/a/b/c"]']
