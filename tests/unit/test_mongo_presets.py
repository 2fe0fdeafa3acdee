"""The MongoDB presets are only names for ordinary policy keys."""

from __future__ import annotations

import dataclasses

from sidecar.config import load_dict, retry_policy

SPELLED_OUT = {
    "max_attempts": 6,
    "retry_on": ["connect-failure", "reset", "unavailable", "overloaded"],
    "backoff": {"initial": "100ms", "max": "10s", "multiplier": 2, "jitter": "full"},
    "backoff_on": ["overloaded"],
    "throttle": {"kind": "mongodb", "capacity": 1000},
    "final_error_labels": "strip-retryable",
    "per_try_timeout": "none",
    "deadline": {"default": "none"},
}


def _policies(spelled: dict) -> dict:
    cfg = load_dict(
        {
            "admin": {"listen": None},
            "policies": {"mine": spelled},
            "upstreams": {"db": {"endpoints": ["127.0.0.1:1"]}},
            "listeners": [
                {"name": "a", "protocol": "mongodb", "listen": "127.0.0.1:0", "upstream": "db"},
                {
                    "name": "b",
                    "protocol": "mongodb",
                    "listen": "127.0.0.1:0",
                    "upstream": "db",
                    "policy": "mine",
                },
                {
                    "name": "c",
                    "protocol": "mongodb",
                    "listen": "127.0.0.1:0",
                    "upstream": "db",
                    "policy": "mongodb-backpressure-2026",
                },
            ],
        },
        {},
    )
    return cfg.policies


def test_the_issue_spelled_out_policy_is_the_preset() -> None:
    p = _policies(SPELLED_OUT)
    preset = dataclasses.replace(retry_policy("x", p["mongodb-backpressure"]), name="x")
    mine = dataclasses.replace(retry_policy("x", p["mine"]), name="x")
    assert preset == mine
    assert p["mine"].final_error_labels == p["mongodb-backpressure"].final_error_labels == "strip-retryable"


def test_the_2026_revision_retries_twice_without_bucket_or_retargeting() -> None:
    p = _policies(SPELLED_OUT)["mongodb-backpressure-2026"]
    engine = retry_policy("2026", p)
    assert engine.max_attempts == 3 and engine.throttle is None and not engine.deprioritize_overloaded
    assert engine.backoff.initial == 0.1 and engine.backoff.max == 10.0
