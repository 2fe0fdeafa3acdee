"""Built-in policies usable by name. A preset is only a name for ordinary policy keys: a policy written with
the same keys behaves exactly the same, and ``sidecar check`` prints presets spelled out.

A policy may also start from a preset (or another policy) with ``extends: NAME`` and change some keys.
"""

from __future__ import annotations

import copy
from typing import Any

_RETRYABLE = ["connect-failure", "reset", "unavailable", "overloaded"]

PRESETS: dict[str, dict[str, Any]] = {
    # The example policy of the README: retries with full-jitter backoff on every retryable class.
    "http-default": {
        "max_attempts": 3,
        "retry_on": _RETRYABLE,
        "backoff": {"initial": "25ms", "max": "1s", "multiplier": 2, "jitter": "full"},
        "backoff_on": [*_RETRYABLE, "timeout"],
        "per_try_timeout": "2s",
        "pushback": True,
        "throttle": {"kind": "grpc", "max_tokens": 10, "token_ratio": 0.1},
        "deadline": {"default": "10s", "header": "X-YaTaxi-Client-TimeoutMs", "expired_status": 498},
        "hedging": None,
        "transparent_retry": False,
        "deprioritize_overloaded": True,
    },
    # gRPC A6: retry UNAVAILABLE, exponential backoff with full jitter, A6 throttling, one transparent
    # retry of a call that never reached the server; the call's own deadline (none if the client sets none).
    "grpc-a6": {
        "max_attempts": 3,
        "retry_on": ["connect-failure", "reset", "unavailable"],
        "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2, "jitter": "full"},
        "backoff_on": ["reset", "unavailable", "overloaded", "timeout"],
        "per_try_timeout": "none",
        "pushback": True,
        "throttle": {"kind": "grpc", "max_tokens": 10, "token_ratio": 0.1},
        "deadline": {"default": "none", "header": "X-YaTaxi-Client-TimeoutMs", "expired_status": 498},
        "hedging": None,
        "transparent_retry": True,
        "deprioritize_overloaded": True,
        "retryable_codes": ["UNAVAILABLE"],
        "overload_codes": ["RESOURCE_EXHAUSTED"],
    },
    # MongoDB Client Backpressure spec: 5 retries (6 attempts), backoff j * min(10s, 100ms * 2^i) on
    # overload only, the mongodb token bucket, overloaded servers deprioritized, maxTimeMS as the deadline.
    "mongodb-backpressure": {
        "max_attempts": 6,
        "retry_on": _RETRYABLE,
        "backoff": {"initial": "100ms", "max": "10s", "multiplier": 2, "jitter": "full"},
        "backoff_on": ["overloaded"],
        "per_try_timeout": "none",
        "pushback": True,
        "throttle": {"kind": "mongodb", "capacity": 1000, "retry_cost": 1, "return_rate": 0.1},
        "deadline": {"default": "none", "header": "X-YaTaxi-Client-TimeoutMs", "expired_status": 498},
        "hedging": None,
        "transparent_retry": False,
        "deprioritize_overloaded": True,
        "final_error_labels": "strip-retryable",
    },
    # The 2026 revision of the spec: 2 retries, no token bucket, no retargeting.
    "mongodb-backpressure-2026": {
        "max_attempts": 3,
        "retry_on": _RETRYABLE,
        "backoff": {"initial": "100ms", "max": "10s", "multiplier": 2, "jitter": "full"},
        "backoff_on": ["overloaded"],
        "per_try_timeout": "none",
        "pushback": True,
        "throttle": None,
        "deadline": {"default": "none", "header": "X-YaTaxi-Client-TimeoutMs", "expired_status": 498},
        "hedging": None,
        "transparent_retry": False,
        "deprioritize_overloaded": False,
        "final_error_labels": "strip-retryable",
    },
}


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` on top of ``base``: nested mappings merge key by key; anything else replaces."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def resolve_policies(raw: dict[str, Any], wanted: set[str], errors: list[tuple[str, str]]) -> dict[str, Any]:
    """Spell out every user policy (following ``extends``) and every preset named in ``wanted``."""
    resolved: dict[str, Any] = {}

    def resolve(name: str, chain: tuple[str, ...]) -> dict[str, Any] | None:
        if name in resolved:
            return resolved[name]
        if name in raw:
            body = raw[name]
            if body is None:
                body = {}
            if not isinstance(body, dict):
                return body  # let the schema report the wrong type
            parent = body.get("extends")
            rest = {k: v for k, v in body.items() if k != "extends"}
            if parent is None:
                result = rest
            elif not isinstance(parent, str):
                errors.append((f"policies.{name}.extends", "expected the name of a policy or preset"))
                result = rest
            elif parent in chain or parent == name:
                errors.append(
                    (f"policies.{name}.extends", f"circular: {' -> '.join((*chain, name, parent))}")
                )
                result = rest
            else:
                base = resolve(parent, (*chain, name))
                if base is None:
                    errors.append(
                        (f"policies.{name}.extends", f"no policy or preset named {parent!r}{known_hint()}")
                    )
                    result = rest
                else:
                    result = deep_merge(base, rest) if isinstance(base, dict) else rest
        elif name in PRESETS:
            result = copy.deepcopy(PRESETS[name])
        else:
            return None
        resolved[name] = result
        return result

    for name in raw:
        resolve(name, ())
    for name in sorted(wanted):
        resolve(name, ())
    return resolved


def known_hint() -> str:
    return f" (presets: {', '.join(PRESETS)})"
