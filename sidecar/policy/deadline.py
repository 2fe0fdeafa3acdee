"""Deadline arithmetic shared by adapters: parse an incoming timeout, render an outgoing one."""

from __future__ import annotations

import math
import re
from typing import Final

_MS: Final = re.compile(rb"^[ \t]*([0-9]+(?:\.[0-9]+)?)[ \t]*$")

#: Deadlines further away than this are absurd and ignored (userver ignores those over a year).
MAX_TIMEOUT_S: Final = 365 * 24 * 3600.0
_INF: Final = math.inf


def parse_timeout_ms(value: str | bytes | None) -> float | None:
    """``"250"`` -> 0.25 s. Unparseable, non-positive or absurd values give ``None`` (use the default)."""
    if value is None:
        return None
    raw = value.encode("ascii", "replace") if isinstance(value, str) else value
    m = _MS.match(raw)
    if m is None:  # only plain ASCII decimal milliseconds: no signs, exponents, underscores
        return None
    ms = float(m.group(1))
    if ms <= 0 or ms / 1000.0 > MAX_TIMEOUT_S:
        return None
    return ms / 1000.0


def timeout_ms(timeout_s: float) -> int:
    """Seconds -> whole milliseconds, rounded down: a propagated timeout never exceeds what remains.
    ``inf`` (no deadline) has nothing to propagate: callers check ``math.isfinite`` first."""
    if not -_INF < timeout_s < _INF:  # not math.isfinite: compiled, that is a module attribute lookup
        raise ValueError("no finite timeout to propagate")
    return max(0, int(timeout_s * 1000.0 + 1e-9))  # int() floors what max() keeps (>= 0)
