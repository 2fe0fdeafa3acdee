"""The sidecar's side of a scenario: the configuration it runs with, compiled by the sidecar's own loader.

Both engines start from :func:`config_dict`: the live engine writes it to a file for the sidecar process,
the des engine compiles it with the same loader and builds real ``Call``s from the result. So the policy a
scenario names is checked, spelled out and compiled exactly as ``sidecar run`` would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import ConfigError, PolicyConfig, UpstreamConfig, load_dict, retry_policy
from ..policy import OutcomeClass, RetryPolicy
from .scenario import Scenario, ScenarioError

LISTENER = "sim"
UPSTREAM = "model"
POLICY = "sim"


def config_dict(s: Scenario, endpoints: list[str], listen: str = "127.0.0.1:0") -> dict[str, Any]:
    return {
        "admin": {"listen": None},
        "policies": {POLICY: dict(s.sidecar.policy)},
        "upstreams": {UPSTREAM: {**s.sidecar.upstream, "endpoints": list(endpoints)}},
        "listeners": [
            {"name": LISTENER, "protocol": "http", "listen": listen, "upstream": UPSTREAM, "policy": POLICY}
        ],
    }


@dataclass(frozen=True, slots=True)
class SidecarPolicy:
    engine: RetryPolicy
    config: PolicyConfig
    upstream: UpstreamConfig


def compile_policy(s: Scenario, endpoints: list[str]) -> SidecarPolicy:
    try:
        cfg = load_dict(config_dict(s, endpoints), {})
    except ConfigError as e:
        raise ScenarioError([(f"sidecar.{p}" if p else "sidecar", m) for p, m in e.errors]) from None
    pc = cfg.policies[POLICY]
    return SidecarPolicy(retry_policy(POLICY, pc), pc, cfg.upstreams[UPSTREAM])


def classify_status(status: int, pc: PolicyConfig) -> OutcomeClass:
    """The HTTP adapter's classification of a status (the model server answers 200 or 503)."""
    if 200 <= status < 300:
        return OutcomeClass.SUCCESS
    if status in pc.overload_status:
        return OutcomeClass.OVERLOADED
    if status in pc.retryable_status:
        return OutcomeClass.UNAVAILABLE
    return OutcomeClass.FATAL if status >= 500 else OutcomeClass.SUCCESS
