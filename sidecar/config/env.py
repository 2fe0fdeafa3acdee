"""``${NAME}`` and ``${NAME:-default}`` in string values, expanded from the environment after YAML parsing
(so a secret with YAML-special characters cannot break the file). ``$${`` writes a literal ``${``.

What the expansion put into the tree is recorded (:class:`Expansions`), so that the effective configuration,
error messages and logs can hide it (``redact.py``) without guessing which values were secret."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_REF = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")

#: What a redacted value (or the expanded part of one) is shown as.
REDACTED = "<redacted>"


class Expansions:
    """Every value that ``${...}`` expansion produced: by key path, the value as it came out and the value as
    written with each reference shown as ``<redacted>`` (``otlp://collector:4317/?key=<redacted>``); and
    every text that was substituted in (defaults included: the rule is "came from expansion", simple to
    trust)."""

    __slots__ = ("by_path", "substituted")

    def __init__(self) -> None:
        self.by_path: dict[str, tuple[str, str]] = {}
        self.substituted: set[str] = set()

    def __eq__(self, other: object) -> bool:
        # Compared with the config that holds it (a reload of an unchanged file is "no change").
        if not isinstance(other, Expansions):
            return NotImplemented
        return self.by_path == other.by_path and self.substituted == other.substituted

    __hash__ = None  # type: ignore[assignment]

    def record(self, path: str, value: str, masked: str, parts: list[str]) -> None:
        self.by_path[path] = (value, masked)
        self.substituted.update(p for p in parts if p)


def expand(
    tree: Any,
    environ: Mapping[str, str],
    path: str,
    errors: list[tuple[str, str]],
    expansions: Expansions | None = None,
) -> Any:
    if isinstance(tree, str):
        if "$" not in tree:
            return tree
        parts: list[str] = []

        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "$${":
                return "${"
            name, default = m.group(1), m.group(2)
            if name in environ:
                parts.append(environ[name])
                return environ[name]
            if default is not None:
                parts.append(default)
                return default
            errors.append((path, f"environment variable {name!r} is not set"))
            return ""

        value = _REF.sub(sub, tree)
        if parts and expansions is not None:
            masked = _REF.sub(lambda m: "${" if m.group(0) == "$${" else REDACTED, tree)
            expansions.record(path, value, masked, parts)
        return value
    if isinstance(tree, dict):
        return {k: expand(v, environ, join(path, k), errors, expansions) for k, v in tree.items()}
    if isinstance(tree, list):
        return [expand(v, environ, f"{path}[{i}]", errors, expansions) for i, v in enumerate(tree)]
    return tree


_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def join(path: str, key: object) -> str:
    """Extend a key path: ``listeners[0].upstream``, ``method_policies["pkg.Svc/Get"]``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    k = str(key)
    if not _PLAIN.match(k):
        return f'{path}["{k}"]'
    return f"{path}.{k}" if path else k
