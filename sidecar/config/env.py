"""``${NAME}`` and ``${NAME:-default}`` in string values, expanded from the environment after YAML parsing
(so a secret with YAML-special characters cannot break the file). ``$${`` writes a literal ``${``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_REF = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


def expand(tree: Any, environ: Mapping[str, str], path: str, errors: list[tuple[str, str]]) -> Any:
    if isinstance(tree, str):
        if "$" not in tree:
            return tree

        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "$${":
                return "${"
            name, default = m.group(1), m.group(2)
            if name in environ:
                return environ[name]
            if default is not None:
                return default
            errors.append((path, f"environment variable {name!r} is not set"))
            return ""

        return _REF.sub(sub, tree)
    if isinstance(tree, dict):
        return {k: expand(v, environ, join(path, k), errors) for k, v in tree.items()}
    if isinstance(tree, list):
        return [expand(v, environ, f"{path}[{i}]", errors) for i, v in enumerate(tree)]
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
