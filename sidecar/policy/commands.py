"""What the engine asks the runtime to do, and the decisions it records on the way.

Commands are immutable records (``NamedTuple``: a frozen dataclass costs about 1 us to build, four times as
much, and several are built per request on the hot path). Compare them by type, not by tuple equality.
"""

from __future__ import annotations

from typing import NamedTuple

from .outcome import Outcome, OutcomeClass
from .reasons import Reason


class SendAttempt(NamedTuple):
    """Send attempt number ``attempt`` (1-based) to ``endpoint``.

    ``timeout``: what this attempt may take, in seconds (``inf``: no limit): min(per-try timeout, remaining
    deadline). Adapters propagate it (``X-YaTaxi-Client-TimeoutMs``, ``grpc-timeout``, ``maxTimeMS``).
    ``whole_deadline``: the timeout is the request's whole remaining deadline (not cut by the per-try timeout).
    ``hedge``: 0 for the first attempt, k for the k-th hedge (hedging policies only).
    """

    attempt: int
    endpoint: str
    timeout: float
    whole_deadline: bool
    hedge: int = 0

    @property
    def previous_attempts(self) -> int:
        return self.attempt - 1


class CancelAttempt(NamedTuple):
    attempt: int
    reason: Reason


class Wake(NamedTuple):
    """Feed me a ``Tick`` at ``at`` (absolute, on the clock the runtime passes in). Replaces earlier wakes;
    ``inf`` means no wake is needed."""

    at: float


class Decision(NamedTuple):
    """What followed attempt ``attempt``'s result, and why. ``delay``: the wait before the next attempt."""

    attempt: int
    endpoint: str
    outcome: OutcomeClass
    reason: Reason
    delay: float = 0.0


class Finish(NamedTuple):
    """The request is over. ``attempt`` is the attempt whose response is the answer (``None``: no attempt
    has one to give; the adapter answers for ``reason`` itself). ``attempts``: how many were sent in all.

    For ``deadline`` the adapter chooses: ``attempt`` is then the last answer received, which MongoDB
    returns as "the current error" while HTTP answers 498 and gRPC ``DEADLINE_EXCEEDED`` regardless."""

    reason: Reason
    attempt: int | None
    outcome: Outcome | None
    attempts: int


Command = SendAttempt | CancelAttempt | Wake | Decision | Finish
