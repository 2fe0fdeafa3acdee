"""Server pushback in HTTP (pure): ``Retry-After`` in both forms and an optional millisecond header.

``Retry-After: 120`` (delta-seconds) or ``Retry-After: Wed, 21 Oct 2015 07:28:00 GMT`` (an HTTP-date,
compared with the wall clock passed in). A millisecond header such as ``x-retry-after-ms: 250`` is more
precise and wins; its value ``-1`` means "do not retry" (gRPC A6's convention).
"""

from __future__ import annotations

import math
from email.utils import parsedate_to_datetime
from typing import Final

from ...policy import PUSHBACK_STOP, Pushback

#: Longer waits are treated as this long (they end the request at its deadline anyway).
MAX_DELAY_S: Final = 24 * 3600.0


def retry_after(value: bytes | str | None, now_wall: float) -> float | None:
    """Seconds to wait from ``Retry-After``, or ``None`` when absent or unreadable. A date in the past
    means "now" (0)."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        return min(float(text), MAX_DELAY_S)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:  # HTTP-dates are GMT; a zoneless one is not an HTTP-date
        return None
    return min(max(0.0, when.timestamp() - now_wall), MAX_DELAY_S)


def millis(value: bytes | str | None) -> Pushback | None:
    """``"250"`` -> wait 0.25 s; ``"-1"`` (any negative) -> do not retry; unreadable -> ``None``."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    try:
        ms = float(text.strip())
    except ValueError:
        return None
    if not math.isfinite(ms):
        return None
    if ms < 0:
        return PUSHBACK_STOP
    return Pushback(min(ms / 1000.0, MAX_DELAY_S))


def pushback(retry_after_value: bytes | None, millis_value: bytes | None, now_wall: float) -> Pushback | None:
    """The server's hint, the millisecond header first."""
    hint = millis(millis_value)
    if hint is not None:
        return hint
    delay = retry_after(retry_after_value, now_wall)
    return None if delay is None else Pushback(delay)
