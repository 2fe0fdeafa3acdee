"""The process's log lines with the configuration's secrets hidden (``config/redact.py`` says which).

``sidecar run`` installs it on the root logger's handlers with the loaded configuration's secrets; a reload
(``App.apply``) hands over the new configuration's (``learn``). Secrets of the old configuration stay hidden
too: requests that began under it may still log.
"""

from __future__ import annotations

import logging

from .config.redact import Redactor

#: The installed one; None: logs are not redacted (in-process tests, library use).
_secrets: Redactor | None = None


class RedactingFormatter(logging.Formatter):
    """Formats a record as the handler's formatter would, then hides the configuration's secrets in the
    whole line (message, arguments, traceback: an exporter's error may quote its endpoint URL)."""

    def __init__(self, inner: logging.Formatter, secrets: Redactor) -> None:
        super().__init__()
        self._inner = inner
        self._secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        return self._secrets.text(self._inner.format(record))


def install(secrets: Redactor) -> None:
    """Hide ``secrets`` in everything the root logger's handlers write from now on."""
    global _secrets
    _secrets = secrets
    for handler in logging.getLogger().handlers:
        handler.setFormatter(RedactingFormatter(handler.formatter or logging.Formatter(), secrets))


def learn(secrets: Redactor) -> None:
    """A reloaded configuration's secrets: hidden from now on as well (nothing when none was installed)."""
    if _secrets is not None:
        _secrets.merge(secrets)
