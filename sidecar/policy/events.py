"""What the runtime tells the engine: immutable, with readable reprs (h11's _events.py habit).

Events with data are immutable records (``record.py``; one per attempt); the field-less ones are frozen dataclass
singletons, so that no two kinds of event ever compare equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .outcome import Outcome
from .record import Record


@dataclass(frozen=True, slots=True)
class Start:
    """The request is ready to be sent (read far enough to start the first attempt)."""


class AttemptEnded(Record):
    """Attempt ``attempt`` has a classified result (for HTTP: the response head; for gRPC: the status)."""

    fields = ("attempt", "outcome")

    def __init__(self, attempt: int, outcome: Outcome) -> None:
        self.attempt: Final = attempt
        self.outcome: Final = outcome


@dataclass(frozen=True, slots=True)
class Tick:
    """The time the engine asked to be woken at (``Wake``) has come."""


class Committed(Record):
    """Part of attempt ``attempt``'s response went to the client: it is the one, whatever comes next."""

    fields = ("attempt",)

    def __init__(self, attempt: int) -> None:
        self.attempt: Final = attempt


@dataclass(frozen=True, slots=True)
class BufferExceeded:
    """The request body outgrew the replay buffer: what is in flight is all there will be."""


@dataclass(frozen=True, slots=True)
class RequestComplete:
    """The client's whole request has been received and handed to the attempts in flight (it was not yet at
    ``Start``): the sidecar's own deadline and the per-try timeouts start counting."""


@dataclass(frozen=True, slots=True)
class ClientGone:
    """The client cancelled or disconnected."""


Event = Start | AttemptEnded | Tick | Committed | RequestComplete | BufferExceeded | ClientGone

START: Final = Start()
TICK: Final = Tick()
BUFFER_EXCEEDED: Final = BufferExceeded()
REQUEST_COMPLETE: Final = RequestComplete()
CLIENT_GONE: Final = ClientGone()
