"""The sidecar's side of a scenario: the configuration it runs with, compiled by the sidecar's own loader.

Both engines start from :func:`config_dict`: the live engine hands it to the sidecar process, the des
engine compiles it with the same loader and builds real ``Call``s from the result, classifying the model
server's answers with the HTTP listener's own classifier. So the policy a scenario names is checked,
spelled out, compiled and applied exactly as ``sidecar run`` would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..adapters.http.classify import HttpClassifier
from ..config import ConfigError, PolicyConfig, UpstreamConfig, load_dict, retry_policy
from ..policy import Outcome, RetryPolicy
from .scenario import Scenario, ScenarioError

LISTENER = "sim"
UPSTREAM = "model"
POLICY = "sim"


def budget_scope(s: Scenario) -> str | None:
    """The scenario's ``retry_budget.scope`` (``None``: no retry budget)."""
    rb = s.sidecar.upstream.get("retry_budget")
    return str(rb.get("scope", "local")) if isinstance(rb, dict) else None


def config_dict(
    s: Scenario, endpoints: list[str], listen: str = "127.0.0.1:0", tickets: bool = False
) -> dict[str, Any]:
    """One sidecar's config (``tickets``: the ``sidecar+tickets`` strategy's, its upstream with the
    ``sidecar.tickets`` concurrency block). A ``scope: fleet`` retry budget is checked as ``local`` (a sidecar
    alone is its own fleet; the des engine shares one budget among its instances instead of going through
    Redis)."""
    upstream = {**s.sidecar.upstream, "endpoints": list(endpoints)}
    if tickets:
        upstream["concurrency"] = dict(s.sidecar.tickets)
    if budget_scope(s) == "fleet":
        upstream["retry_budget"] = {**upstream["retry_budget"], "scope": "local"}
    return {
        "admin": {"listen": None},
        "policies": {POLICY: dict(s.sidecar.policy)},
        "upstreams": {UPSTREAM: upstream},
        "listeners": [
            {"name": LISTENER, "protocol": "http", "listen": listen, "upstream": UPSTREAM, "policy": POLICY}
        ],
    }


@dataclass(frozen=True, slots=True)
class SidecarPolicy:
    engine: RetryPolicy
    config: PolicyConfig
    upstream: UpstreamConfig
    classifier: HttpClassifier  # the HTTP listener's own: the model server answers HTTP statuses

    def classify(self, status: int) -> Outcome:
        return self.classifier.response(status, [], 0.0)


def compile_policy(s: Scenario, endpoints: list[str], tickets: bool = False) -> SidecarPolicy:
    try:
        cfg = load_dict(config_dict(s, endpoints, tickets=tickets), {})
    except ConfigError as e:
        errors = []
        for p, m in e.errors:
            if tickets and p.startswith(f"upstreams.{UPSTREAM}.concurrency"):  # the key the user wrote
                p = "tickets" + p.removeprefix(f"upstreams.{UPSTREAM}.concurrency")
            errors.append((f"sidecar.{p}" if p else "sidecar", m))
        raise ScenarioError(errors) from None
    pc = cfg.policies[POLICY]
    return SidecarPolicy(
        retry_policy(POLICY, pc), pc, cfg.upstreams[UPSTREAM], HttpClassifier.from_policy(pc)
    )
