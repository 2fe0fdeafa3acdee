"""The effective configuration as plain data: presets spelled out, durations as text, secrets redacted
(``redact.py``: values from ``${VAR}``, URL userinfo, keys named like password, token, secret or key)."""

from __future__ import annotations

from typing import Any

import yaml

from .env import REDACTED
from .redact import Redactor, secret_key_values
from .schema import Config

__all__ = ["REDACTED", "effective", "effective_yaml", "redactor"]


def redactor(config: Config) -> Redactor:
    """The redactor of one loaded configuration: it knows what came from ``${VAR}`` and the values of its
    secret keys (to hide them in free text too: logs, error messages)."""
    r = Redactor(config.expansions)
    r.add_values(secret_key_values(config.model_dump(mode="json")))
    return r


def effective(config: Config) -> dict[str, Any]:
    data = config.model_dump(mode="json")
    out: dict[str, Any] = redactor(config).tree(data)
    for name, uc in config.upstreams.items():
        u = uc.mongo_uri
        if u is not None and u.srv is not None:  # members come from DNS at run time: say where
            shown = out["upstreams"][name]
            srv = {"name": f"_{u.srv_service}._tcp.{u.srv}", "max_hosts": u.srv_max_hosts}
            out["upstreams"][name] = {k: v for k, v in shown.items() if k != "endpoints"} | {"srv": srv}
    return out


def effective_yaml(config: Config) -> str:
    return yaml.safe_dump(effective(config), sort_keys=False, default_flow_style=None, width=100)
