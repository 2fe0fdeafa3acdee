"""The effective configuration as plain data: presets spelled out, durations as text, secrets redacted."""

from __future__ import annotations

from typing import Any

import yaml

from .schema import Config

REDACTED = "<redacted>"
_SECRET_KEYS = {"password"}


def effective(config: Config) -> dict[str, Any]:
    data = config.model_dump(mode="json")
    return _redact(data)


def effective_yaml(config: Config) -> str:
    return yaml.safe_dump(effective(config), sort_keys=False, default_flow_style=None, width=100)


def _redact(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: (REDACTED if k in _SECRET_KEYS and v is not None else _redact(v)) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_redact(v) for v in tree]
    return tree
