"""A standard gRPC service config (``methodConfig``, ``retryThrottling``), validated as gRPC validates it
(A6) and mapped onto the sidecar's policies.

Each ``methodConfig`` entry becomes a named policy ``<listener>.methodConfig[i]`` (printed by
``sidecar check``): the listener's own policy with the retry/hedging keys replaced. Its names become
``method_policies`` keys: ``package.Service/Method``, ``package.Service`` (``method`` empty) and ``*`` (the
default entry ``{}``); keys the user wrote in ``method_policies`` win. ``retryThrottling`` becomes the
``throttle`` of those policies, so they share one bucket per upstream. A method's ``timeout`` caps the
call's deadline (gRPC takes the smaller of the client's deadline and the service config's timeout).

Validation follows gRPC: ``maxAttempts`` must be greater than 1 and is clamped to 5, status codes are names
or numbers, durations are protobuf JSON durations (``"0.1s"``), a method has a retry or a hedging policy
but not both, a name appears once. Known gRPC keys the sidecar has no use for (load balancing, health
checks, message size limits, waitForReady) are accepted and ignored; any other key is an error.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

import yaml

from .env import join
from .presets import deep_merge
from .schema import grpc_code_name

ErrorList = list[tuple[str, str]]
MAX_ATTEMPTS_CAP = 5
DEFAULT_KEY = "*"

_DURATION = re.compile(r"^(\d+)(\.\d{1,9})?s$")
_TOP_KEYS = {"methodConfig", "retryThrottling"}
_TOP_IGNORED = {"loadBalancingConfig", "loadBalancingPolicy", "healthCheckConfig"}
_METHOD_KEYS = {"name", "retryPolicy", "hedgingPolicy", "timeout"}
_METHOD_IGNORED = {"waitForReady", "maxRequestMessageBytes", "maxResponseMessageBytes"}
_RETRY_KEYS = {
    "maxAttempts",
    "initialBackoff",
    "maxBackoff",
    "backoffMultiplier",
    "retryableStatusCodes",
    "perAttemptRecvTimeout",
}
_HEDGE_KEYS = {"maxAttempts", "hedgingDelay", "nonFatalStatusCodes"}


@dataclass(frozen=True, slots=True)
class RetrySpec:
    max_attempts: int
    initial_backoff: float
    max_backoff: float
    multiplier: float
    codes: tuple[str, ...]
    per_attempt_timeout: float | None = None


@dataclass(frozen=True, slots=True)
class HedgeSpec:
    max_attempts: int
    delay: float
    codes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MethodConfig:
    keys: tuple[str, ...]  # method_policies keys: "pkg.Svc/Method", "pkg.Svc" or "*"
    retry: RetrySpec | None = None
    hedging: HedgeSpec | None = None
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    methods: tuple[MethodConfig, ...] = ()
    throttling: tuple[float, float] | None = None  # (maxTokens, tokenRatio)

    def timeouts(self) -> dict[str, float]:
        """method_policies key -> the service config's timeout for it."""
        return {k: m.timeout for m in self.methods if m.timeout is not None for k in m.keys}


def policy_name(listener: str, index: int) -> str:
    return f"{listener}.methodConfig[{index}]"


# -- parsing ----------------------------------------------------------------------------------------
def parse(value: Any, path: str, errors: ErrorList) -> ServiceConfig | None:
    """Validate a service config (a mapping, or YAML/JSON text). Errors are appended with their path."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as e:
            errors.append((path, f"not valid JSON or YAML: {getattr(e, 'problem', None) or e}"))
            return None
        if value is None:
            return ServiceConfig()
    if not isinstance(value, dict):
        errors.append((path, "expected a gRPC service config (a mapping with methodConfig, retryThrottling)"))
        return None
    before = len(errors)
    _unknown(value, _TOP_KEYS | _TOP_IGNORED, path, errors)
    methods: list[MethodConfig] = []
    raw_methods = value.get("methodConfig", [])
    seen: dict[str, str] = {}
    if not isinstance(raw_methods, list):
        errors.append((join(path, "methodConfig"), "expected a list"))
        raw_methods = []
    for i, mc in enumerate(raw_methods):
        parsed = _method(mc, f"{join(path, 'methodConfig')}[{i}]", errors, seen)
        if parsed is not None:
            methods.append(parsed)
    throttling = None
    if "retryThrottling" in value:
        throttling = _throttling(value["retryThrottling"], join(path, "retryThrottling"), errors)
    if len(errors) > before:
        return None
    return ServiceConfig(tuple(methods), throttling)


def _method(mc: Any, path: str, errors: ErrorList, seen: dict[str, str]) -> MethodConfig | None:
    if not isinstance(mc, dict):
        errors.append((path, "expected a mapping (name, retryPolicy or hedgingPolicy, timeout)"))
        return None
    _unknown(mc, _METHOD_KEYS | _METHOD_IGNORED, path, errors)
    keys = _names(mc.get("name"), join(path, "name"), errors, seen)
    retry = hedging = timeout = None
    if "retryPolicy" in mc and "hedgingPolicy" in mc:
        errors.append((path, "a method has a retryPolicy or a hedgingPolicy, not both"))
    elif "retryPolicy" in mc:
        retry = _retry(mc["retryPolicy"], join(path, "retryPolicy"), errors)
    elif "hedgingPolicy" in mc:
        hedging = _hedging(mc["hedgingPolicy"], join(path, "hedgingPolicy"), errors)
    if "timeout" in mc:
        timeout = _duration(mc["timeout"], join(path, "timeout"), errors)
    return MethodConfig(tuple(keys), retry, hedging, timeout)


def _names(raw: Any, path: str, errors: ErrorList, seen: dict[str, str]) -> list[str]:
    if not isinstance(raw, list) or not raw:
        errors.append((path, "expected a non-empty list of {service, method}"))
        return []
    keys: list[str] = []
    for j, n in enumerate(raw):
        p = f"{path}[{j}]"
        if not isinstance(n, dict):
            errors.append((p, "expected a mapping {service, method}"))
            continue
        _unknown(n, {"service", "method"}, p, errors)
        service, method = n.get("service", ""), n.get("method", "")
        if not isinstance(service, str) or not isinstance(method, str):
            errors.append((p, "service and method must be strings"))
            continue
        if not service and method:
            errors.append((p, "a method needs its service"))
            continue
        if "/" in service or "/" in method:
            errors.append((p, "service and method must not contain '/'"))
            continue
        key = f"{service}/{method}" if method else (service or DEFAULT_KEY)
        if key in seen:
            errors.append((p, f"{_describe(key)} is already configured at {seen[key]}"))
            continue
        seen[key] = p
        keys.append(key)
    return keys


def _describe(key: str) -> str:
    return "the default name {}" if key == DEFAULT_KEY else repr(key)


def _retry(raw: Any, path: str, errors: ErrorList) -> RetrySpec | None:
    if not isinstance(raw, dict):
        errors.append((path, "expected a mapping"))
        return None
    before = len(errors)
    _unknown(raw, _RETRY_KEYS, path, errors)
    attempts = _max_attempts(raw, path, errors)
    initial = _required_duration(raw, "initialBackoff", path, errors, positive=True)
    maximum = _required_duration(raw, "maxBackoff", path, errors, positive=True)
    multiplier = None
    if "backoffMultiplier" not in raw:
        errors.append((join(path, "backoffMultiplier"), "required key is missing"))
    else:
        multiplier = _number(raw["backoffMultiplier"], join(path, "backoffMultiplier"), errors)
        if multiplier is not None and multiplier <= 0:
            errors.append((join(path, "backoffMultiplier"), "must be greater than 0"))
        elif multiplier is not None and multiplier < 1:
            errors.append(
                (
                    join(path, "backoffMultiplier"),
                    f"{multiplier} < 1 is not supported: backoff never shrinks here",
                )
            )
    codes = _codes(raw.get("retryableStatusCodes"), join(path, "retryableStatusCodes"), errors, required=True)
    per_try = None
    if "perAttemptRecvTimeout" in raw:
        per_try = _duration(raw["perAttemptRecvTimeout"], join(path, "perAttemptRecvTimeout"), errors)
        if per_try is not None and per_try <= 0:
            errors.append((join(path, "perAttemptRecvTimeout"), "must be greater than 0"))
    if len(errors) > before:
        return None
    assert attempts is not None and initial is not None and maximum is not None and multiplier is not None
    return RetrySpec(attempts, min(initial, maximum), maximum, multiplier, codes, per_try)


def _hedging(raw: Any, path: str, errors: ErrorList) -> HedgeSpec | None:
    if not isinstance(raw, dict):
        errors.append((path, "expected a mapping"))
        return None
    before = len(errors)
    _unknown(raw, _HEDGE_KEYS, path, errors)
    attempts = _max_attempts(raw, path, errors)
    delay = 0.0
    if "hedgingDelay" in raw:
        delay = _duration(raw["hedgingDelay"], join(path, "hedgingDelay"), errors) or 0.0
    codes = _codes(
        raw.get("nonFatalStatusCodes", []), join(path, "nonFatalStatusCodes"), errors, required=False
    )
    if len(errors) > before:
        return None
    assert attempts is not None
    return HedgeSpec(attempts, delay, codes)


def _throttling(raw: Any, path: str, errors: ErrorList) -> tuple[float, float] | None:
    if not isinstance(raw, dict):
        errors.append((path, "expected a mapping {maxTokens, tokenRatio}"))
        return None
    _unknown(raw, {"maxTokens", "tokenRatio"}, path, errors)
    out: list[float] = []
    for key, low, high in (("maxTokens", 0, 1000), ("tokenRatio", 0, None)):
        p = join(path, key)
        if key not in raw:
            errors.append((p, "required key is missing"))
            continue
        v = _number(raw[key], p, errors)
        if v is None:
            continue
        if v <= low or (high is not None and v > high):
            errors.append((p, f"must be greater than {low}" + (f" and at most {high}" if high else "")))
            continue
        out.append(v)
    return (out[0], out[1]) if len(out) == 2 else None


# -- value checks -----------------------------------------------------------------------------------
def _unknown(raw: dict[str, Any], known: set[str], path: str, errors: ErrorList) -> None:
    for k in raw:
        if k not in known:
            errors.append((join(path, k), "unknown key"))


def _max_attempts(raw: dict[str, Any], path: str, errors: ErrorList) -> int | None:
    p = join(path, "maxAttempts")
    if "maxAttempts" not in raw:
        errors.append((p, "required key is missing"))
        return None
    v = raw["maxAttempts"]
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        errors.append((p, "expected an integer"))
        return None
    if v <= 1:
        errors.append((p, f"must be greater than 1, not {v}"))
        return None
    return min(v, MAX_ATTEMPTS_CAP)


def _number(v: Any, path: str, errors: ErrorList) -> float | None:
    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            v = float(v)
    if isinstance(v, bool) or not isinstance(v, int | float):
        errors.append((path, "expected a number"))
        return None
    return float(v)


def _duration(v: Any, path: str, errors: ErrorList) -> float | None:
    m = _DURATION.match(v.strip()) if isinstance(v, str) else None
    if m is None:
        errors.append((path, f"{v!r} is not a duration: write seconds with an 's' suffix, like \"0.1s\""))
        return None
    return float(m.group(1) + (m.group(2) or ""))


def _required_duration(
    raw: dict[str, Any], key: str, path: str, errors: ErrorList, positive: bool
) -> float | None:
    p = join(path, key)
    if key not in raw:
        errors.append((p, "required key is missing"))
        return None
    d = _duration(raw[key], p, errors)
    if d is not None and positive and d <= 0:
        errors.append((p, "must be greater than 0"))
        return None
    return d


def _codes(raw: Any, path: str, errors: ErrorList, required: bool) -> tuple[str, ...]:
    if not isinstance(raw, list) or (required and not raw):
        errors.append((path, "expected a non-empty list of status codes" if required else "expected a list"))
        return ()
    out: list[str] = []
    for j, c in enumerate(raw):
        try:
            name = grpc_code_name(c)
        except ValueError as e:
            errors.append((f"{path}[{j}]", str(e)))
            continue
        if name == "OK":
            errors.append((f"{path}[{j}]", "OK cannot be retried"))
            continue
        if name not in out:
            out.append(name)
    return tuple(out)


# -- mapping onto policies --------------------------------------------------------------------------
def policy_keys(mc: MethodConfig, throttling: tuple[float, float] | None) -> dict[str, Any]:
    """The policy keys a methodConfig sets (on top of the listener's policy)."""
    keys: dict[str, Any] = {
        "throttle": None
        if throttling is None
        else {"kind": "grpc", "max_tokens": throttling[0], "token_ratio": throttling[1]},
        "deadline": {"default": "none" if mc.timeout is None else _seconds(mc.timeout)},
        "per_try_timeout": "none",
        "pushback": True,
        "transparent_retry": True,
        "overload_codes": ["RESOURCE_EXHAUSTED"],
    }
    if mc.retry is not None:
        r = mc.retry
        classes = _classes(r.codes)
        keys.update(
            max_attempts=r.max_attempts,
            retry_on=classes,
            backoff={
                "initial": _seconds(r.initial_backoff),
                "max": _seconds(r.max_backoff),
                "multiplier": r.multiplier,
                "jitter": "full",
            },
            backoff_on=[c for c in classes if c != "connect-failure"] or ["unavailable"],
            retryable_codes=[c for c in r.codes if c not in ("RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")],
            hedging=None,
        )
        if r.per_attempt_timeout is not None:
            keys["per_try_timeout"] = _seconds(r.per_attempt_timeout)
    elif mc.hedging is not None:
        h = mc.hedging
        classes = _classes(h.codes)  # a hedge that could not connect lets the next one go
        keys.update(
            max_attempts=h.max_attempts,
            retry_on=classes,
            retryable_codes=[c for c in h.codes if c not in ("RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")],
            hedging={"max_attempts": h.max_attempts, "delay": _seconds(h.delay), "non_fatal": classes},
        )
    else:  # no retry policy: gRPC sends one attempt (and its transparent retry)
        keys.update(max_attempts=2, retry_on=["connect-failure"], hedging=None)
    return keys


def _classes(codes: tuple[str, ...]) -> list[str]:
    """The outcome classes a list of retryable/non-fatal status codes stands for."""
    classes = ["connect-failure"]
    if "UNAVAILABLE" in codes:
        classes += ["reset", "unavailable"]
    elif any(c not in ("RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED") for c in codes):
        classes.append("unavailable")
    if "RESOURCE_EXHAUSTED" in codes:
        classes.append("overloaded")
    if "DEADLINE_EXCEEDED" in codes:
        classes.append("timeout")
    return classes


def _seconds(s: float) -> str:
    return f"{round(s * 1000, 6):g}ms"


def expand(tree: dict[str, Any], errors: ErrorList, default_policy: str = "grpc-a6") -> dict[str, Any]:
    """Loader hook: validate each gRPC listener's ``service_config`` and add its policies, its
    ``method_policies`` entries and its timeouts (``method_timeouts``) to the (presets already resolved)
    configuration tree: the listener reads them from there and never parses the service config again."""
    listeners = tree.get("listeners")
    policies = tree.get("policies")
    if not isinstance(listeners, list) or not isinstance(policies, dict):
        return tree
    policies = dict(policies)
    new_listeners = []
    for i, lst in enumerate(listeners):
        if isinstance(lst, dict) and lst.get("protocol") == "grpc":
            _check_method_keys(lst.get("method_policies"), f"listeners[{i}].method_policies", errors)
            _check_method_keys(lst.get("method_timeouts"), f"listeners[{i}].method_timeouts", errors)
            unary = lst.get("unary_requests")
            if isinstance(unary, list):
                for j, key in enumerate(unary):
                    if not _is_method_key(key):
                        errors.append((f"listeners[{i}].unary_requests[{j}]", _METHOD_KEY_EXPECTED))
        if not (
            isinstance(lst, dict) and lst.get("protocol") == "grpc" and lst.get("service_config") is not None
        ):
            new_listeners.append(lst)
            continue
        sc = parse(lst["service_config"], f"listeners[{i}].service_config", errors)
        name = lst.get("name") if isinstance(lst.get("name"), str) else f"listeners[{i}]"
        base_name = lst.get("policy") if isinstance(lst.get("policy"), str) else default_policy
        base = policies.get(base_name)
        if sc is None or not isinstance(base, dict):
            new_listeners.append(lst)
            continue
        mp = dict(lst.get("method_policies") or {}) if isinstance(lst.get("method_policies"), dict) else {}
        mt = dict(lst.get("method_timeouts") or {}) if isinstance(lst.get("method_timeouts"), dict) else {}
        for key, timeout in sc.timeouts().items():
            mt.setdefault(key, _seconds(timeout))
        for j, mc in enumerate(sc.methods):
            pname = policy_name(name, j)
            if pname in policies:
                errors.append((f"policies.{pname}", f"this name is taken by listeners[{i}].service_config"))
                continue
            keys = policy_keys(mc, sc.throttling)
            body = deep_merge(base, {k: v for k, v in keys.items() if k != "throttle"})
            body["throttle"] = keys["throttle"]
            policies[pname] = body
            for key in mc.keys:
                mp.setdefault(key, pname)
        new_listeners.append({**lst, "method_policies": mp, "method_timeouts": mt})
    return {**tree, "policies": policies, "listeners": new_listeners}


_METHOD_KEY = re.compile(r"^[^/*\s]+(/[^/*\s]+)?$")
_METHOD_KEY_EXPECTED = "expected package.Service, package.Service/Method or * (every other method)"


def _is_method_key(key: object) -> bool:
    return isinstance(key, str) and (key == DEFAULT_KEY or _METHOD_KEY.match(key) is not None)


def _check_method_keys(mp: Any, path: str, errors: ErrorList) -> None:
    if not isinstance(mp, dict):
        return
    for key in mp:
        if not _is_method_key(key):
            errors.append((join(path, key), _METHOD_KEY_EXPECTED))
