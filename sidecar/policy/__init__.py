"""The policy core: pure retry, hedging, throttling and deadline decisions (no I/O, no clocks, no globals).

Adapters classify protocol results into :class:`Outcome`; a :class:`Call` per request turns events into
commands; the runtime carries them out.
"""

from .commands import CancelAttempt, Command, Decision, Finish, SendAttempt, Wake
from .engine import Call, EndpointPicker
from .events import (
    BUFFER_EXCEEDED,
    CLIENT_GONE,
    REQUEST_COMPLETE,
    START,
    TICK,
    AttemptEnded,
    BufferExceeded,
    ClientGone,
    Committed,
    Event,
    RequestComplete,
    Start,
    Tick,
)
from .outcome import PUSHBACK_STOP, SUCCESS, Outcome, OutcomeClass, Pushback
from .reasons import GIVE_UPS, Reason
from .spec import BackoffSpec, HedgingSpec, Jitter, RetryPolicy, ThrottleKind, ThrottleSpec
from .throttle import BudgetedThrottle, GrpcThrottle, MongoThrottle, RetryBudget, Throttle, make_throttle

__all__ = [
    "BUFFER_EXCEEDED",
    "CLIENT_GONE",
    "GIVE_UPS",
    "PUSHBACK_STOP",
    "REQUEST_COMPLETE",
    "START",
    "SUCCESS",
    "TICK",
    "AttemptEnded",
    "BackoffSpec",
    "BufferExceeded",
    "Call",
    "CancelAttempt",
    "ClientGone",
    "Command",
    "Committed",
    "Decision",
    "EndpointPicker",
    "Event",
    "Finish",
    "BudgetedThrottle",
    "GrpcThrottle",
    "HedgingSpec",
    "Jitter",
    "MongoThrottle",
    "Outcome",
    "OutcomeClass",
    "Pushback",
    "Reason",
    "RequestComplete",
    "RetryBudget",
    "RetryPolicy",
    "SendAttempt",
    "Start",
    "Throttle",
    "ThrottleKind",
    "ThrottleSpec",
    "Tick",
    "Wake",
    "make_throttle",
]
