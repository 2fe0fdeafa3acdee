"""What the engine asks the runtime to do, and the decisions it records on the way.

Commands are immutable records (``record.py``); several are built per request on the hot path.
"""

from __future__ import annotations

from typing import Final

from .outcome import Outcome, OutcomeClass
from .reasons import Reason
from .record import Record


class SendAttempt(Record):
    """Send attempt number ``attempt`` (1-based) to ``endpoint``.

    ``timeout``: what this attempt may take, in seconds (``inf``: no limit): min(per-try timeout, remaining
    deadline). Adapters propagate it (``X-YaTaxi-Client-TimeoutMs``, ``grpc-timeout``, ``maxTimeMS``).
    ``whole_deadline``: the timeout is the request's whole remaining deadline (not cut by the per-try timeout).
    ``hedge``: 0 for the first attempt, k for the k-th hedge (hedging policies only).
    """

    fields = ("attempt", "endpoint", "timeout", "whole_deadline", "hedge")

    def __init__(
        self, attempt: int, endpoint: str, timeout: float, whole_deadline: bool, hedge: int = 0
    ) -> None:
        self.attempt: Final = attempt
        self.endpoint: Final = endpoint
        self.timeout: Final = timeout
        self.whole_deadline: Final = whole_deadline
        self.hedge: Final = hedge

    @property
    def previous_attempts(self) -> int:
        return self.attempt - 1


class CancelAttempt(Record):
    """Abandon attempt ``attempt`` (its result, should one come, is dropped)."""

    fields = ("attempt", "reason")

    def __init__(self, attempt: int, reason: Reason) -> None:
        self.attempt: Final = attempt
        self.reason: Final = reason


class Wake(Record):
    """Feed me a ``Tick`` at ``at`` (absolute, on the clock the runtime passes in). Replaces earlier wakes;
    ``inf`` means no wake is needed."""

    fields = ("at",)

    def __init__(self, at: float) -> None:
        self.at: Final = at


class Decision(Record):
    """What followed attempt ``attempt``'s result, and why. ``delay``: the wait before the next attempt."""

    fields = ("attempt", "endpoint", "outcome", "reason", "delay")

    def __init__(
        self, attempt: int, endpoint: str, outcome: OutcomeClass, reason: Reason, delay: float = 0.0
    ) -> None:
        self.attempt: Final = attempt
        self.endpoint: Final = endpoint
        self.outcome: Final = outcome
        self.reason: Final = reason
        self.delay: Final = delay


class Finish(Record):
    """The request is over. ``attempt`` is the attempt whose response is the answer (``None``: no attempt
    has one to give; the adapter answers for ``reason`` itself). ``attempts``: how many were sent in all.

    ``own_deadline``: the client sent no deadline, so any deadline was the sidecar's own bound. For
    ``deadline`` the adapter chooses by it: ``attempt`` is then the last answer received. When the deadline
    was the client's, MongoDB returns that answer as "the current error" while HTTP answers 498 and gRPC
    ``DEADLINE_EXCEEDED`` regardless; when it was the sidecar's own, every protocol delivers that answer
    unchanged, and only when no upstream answered at all says so itself (504, ``DEADLINE_EXCEEDED``)."""

    fields = ("reason", "attempt", "outcome", "attempts", "own_deadline")

    def __init__(
        self,
        reason: Reason,
        attempt: int | None,
        outcome: Outcome | None,
        attempts: int,
        own_deadline: bool = False,
    ) -> None:
        self.reason: Final = reason
        self.attempt: Final = attempt
        self.outcome: Final = outcome
        self.attempts: Final = attempts
        self.own_deadline: Final = own_deadline


Command = SendAttempt | CancelAttempt | Wake | Decision | Finish
