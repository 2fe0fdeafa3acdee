"""The answer to "may this request (or attempt) go ahead?", shared by the token bucket and the ticket pools."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .reasons import Rejection


class Verdict(Enum):
    ADMITTED = "admitted"  # go ahead now
    QUEUED = "queued"  # wait: until ``at`` (bucket) or until granted, giving up at ``at`` (tickets)
    REJECTED = "rejected"  # refused now, for ``reason``; ``at``: when to come back, if known


@dataclass(frozen=True, slots=True)
class Decision:
    """``waiter`` names a queued request for the calls that end its wait (0 when not queued).

    A frozen dataclass, not a ``policy.record.Record``: an interpreted class cannot subclass the compiled
    ``Record``, and only ``bucket.py`` of this package is compiled (``sidecar/native.py``: it decides every
    request of a listener with a request limit; its admitted path makes no ``Decision``)."""

    verdict: Verdict
    at: float
    reason: Rejection | None = None
    waiter: int = 0

    @property
    def admitted(self) -> bool:
        return self.verdict is Verdict.ADMITTED

    @property
    def queued(self) -> bool:
        return self.verdict is Verdict.QUEUED

    @property
    def rejected(self) -> bool:
        return self.verdict is Verdict.REJECTED


def check_queue_limits(max_queue: int, max_wait: float) -> None:
    """A queue's limits, as the bucket and the ticket pools both take them: refused with the value named."""
    if max_queue < 0:
        raise ValueError(f"max_queue must be 0 or more, not {max_queue!r}")
    if not max_wait >= 0:
        raise ValueError(f"max_wait must be 0 or more seconds, not {max_wait!r}")
