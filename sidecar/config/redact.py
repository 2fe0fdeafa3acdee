"""Secrets kept out of what the sidecar shows: ``/config``, ``sidecar check``, configuration errors and logs.

Three kinds of value are secret:

1. every value that ``${VAR}`` expansion produced (known from the load, ``env.Expansions``, not guessed):
   in the effective configuration the reference is shown as ``<redacted>`` inside the text as written
   (``http://collector:4318/?key=<redacted>``); a value the schema normalised (``${TIMEOUT}`` -> ``2s``)
   is redacted whole;
2. the userinfo of any URL (``otlp://user:pass@host`` -> ``otlp://<redacted>@host``,
   ``redis://:pw@h``, ``mongodb://u:p@h1,h2``);
3. the value of any key whose name's LAST word is password, passwd, passphrase, token, secret, key, apikey,
   credential(s) (words split at ``_``, ``-``, ``.`` and case changes; case-insensitive): ``password``,
   ``api_key``, ``access_token``, ``clientSecret`` are secret; ``key_file`` (a path), ``max_tokens``,
   ``token_ratio``, ``secret_name`` are not: the last word says what the value is. Only keys spelled as
   settings count (letters, digits, ``_``, ``-``): a gRPC method path ``pkg.Svc/RotateKey`` in
   ``method_policies`` names a method, and its value is a policy name.

In free text (error messages, log lines) the secret values themselves are replaced wherever they occur,
with the same userinfo rule. A substituted value shorter than :data:`MIN_HUNTED` characters (a port, a log
level) is masked in the effective configuration but not hunted in free text, where replacing a short
string everywhere would garble the line; a secret that short is not one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from .env import REDACTED, Expansions, join

SECRET_WORDS = frozenset(
    {"password", "passwd", "passphrase", "token", "secret", "key", "apikey", "credential", "credentials"}
)
MIN_HUNTED = 8
_SETTING = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s]*)@")


def is_secret_key(name: object) -> bool:
    """Does a key with this name hold a secret? Its name's last word decides (see the module docstring)."""
    if not isinstance(name, str) or not _SETTING.match(name):
        return False  # a map key naming something (a gRPC method "pkg.Svc/RotateKey"), not a setting
    words = _WORD.findall(name)
    return bool(words) and words[-1].lower() in SECRET_WORDS


def redact_userinfo(text: str) -> str:
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)


class Redactor:
    """Knows one configuration's secrets; hides them in its effective tree and in any text."""

    __slots__ = ("expansions", "_hunted")

    def __init__(self, expansions: Expansions | None = None, values: Iterable[str] = ()) -> None:
        self.expansions = expansions if expansions is not None else Expansions()
        found = {v for v in self.expansions.substituted if len(v) >= MIN_HUNTED}
        found.update(v for v in values if len(v) >= MIN_HUNTED)
        self._hunted = sorted(found, key=len, reverse=True)  # longest first: a secret inside another

    def add_values(self, values: Iterable[str]) -> None:
        """More secrets to hunt in text (the values of secret keys, once the configuration is known)."""
        found = set(self._hunted)
        found.update(v for v in values if len(v) >= MIN_HUNTED)
        self._hunted = sorted(found, key=len, reverse=True)

    def merge(self, other: Redactor) -> None:
        """Hunt ``other``'s secrets in text as well (a reloaded configuration's, beside the old ones)."""
        self.add_values(other._hunted)

    def text(self, text: str) -> str:
        for v in self._hunted:
            if v in text:
                text = text.replace(v, REDACTED)
        return redact_userinfo(text) if "@" in text else text

    def tree(self, data: Any, path: str = "") -> Any:
        """A configuration as plain data (``model_dump(mode="json")``), with every secret replaced."""
        if isinstance(data, dict):
            return {
                k: (REDACTED if is_secret_key(k) and v is not None else self.tree(v, join(path, k)))
                for k, v in data.items()
            }
        if isinstance(data, list):
            return [self.tree(v, f"{path}[{i}]") for i, v in enumerate(data)]
        known = self.expansions.by_path.get(path)
        if known is not None:
            value, masked = known
            return self.text(masked) if data == value else REDACTED
        if isinstance(data, str):
            return self.text(data)
        return data


def secret_key_values(data: Any) -> list[str]:
    """Every string found under a secret key of a plain-data tree (to hunt in text as well)."""
    out: list[str] = []
    if isinstance(data, dict):
        for k, v in data.items():
            if is_secret_key(k):
                out.extend(_strings(v))
            else:
                out.extend(secret_key_values(v))
    elif isinstance(data, list):
        for v in data:
            out.extend(secret_key_values(v))
    return out


def _strings(data: Any) -> list[str]:
    if isinstance(data, str):
        return [data]
    if isinstance(data, dict):
        return [s for v in data.values() for s in _strings(v)]
    if isinstance(data, list):
        return [s for v in data for s in _strings(v)]
    return []
