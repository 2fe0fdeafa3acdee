"""The MongoDB app connection's state machine (``connection.AppState``, owned by ``AppConnection``): every
legal transition walked, and a transition the machine does not have raised at once (a bug, never
swallowed). Pure: no sockets."""

from __future__ import annotations

import pytest

from sidecar.adapters.mongo.connection import AppState, Intake, Phase
from sidecar.adapters.transitions import InvalidTransition


def test_every_phase_transition() -> None:
    s = AppState()
    assert s.phase is Phase.IDLE and not s.busy
    s.begin()
    assert s.phase is Phase.BUSY and s.busy
    assert s.answered() is Phase.IDLE
    s.begin()
    s.finish()  # a drain while a message is answered: it is the last
    assert s.phase is Phase.LAST and s.busy
    s.finish()  # a second drain changes nothing
    assert s.phase is Phase.LAST
    assert s.answered() is Phase.CLOSING and not s.busy
    s.finish()
    assert s.phase is Phase.CLOSING
    assert s.lost() is None and s.closed
    assert s.answered() is Phase.CLOSED  # an answer cut short by the loss ends quietly
    s.finish()
    assert s.phase is Phase.CLOSED

    idle = AppState()
    idle.finish()  # a drain of an idle connection: close now
    assert idle.phase is Phase.CLOSING
    busy = AppState()
    busy.begin()
    busy.lost()  # the app went away mid-request
    assert busy.phase is Phase.CLOSED and busy.answered() is Phase.CLOSED


def test_every_intake_transition() -> None:
    s = AppState()
    assert s.intake is Intake.READING and not s.paused
    s.fill()
    assert s.intake is Intake.FULL and s.paused
    s.drained()
    assert s.intake is Intake.READING
    s.starve()
    s.waiting(7)
    assert s.intake is Intake.STARVED and s.ticket == 7 and s.paused
    s.granted(full=False)
    assert s.intake is Intake.READING and s.ticket is None
    s.fill()
    s.starve()  # a full queue, and the next message does not fit either
    s.granted(full=True)
    assert s.intake is Intake.FULL
    s.drained()
    s.starve()
    s.waiting(9)
    assert s.lost() == 9  # the budget's ticket to cancel goes with the connection
    assert s.ticket is None


@pytest.mark.parametrize(
    ("steps", "event", "state"),
    [
        ((), "answered", "idle"),  # nothing was being answered
        (("begin",), "begin", "busy"),  # one message at a time
        (("finish",), "begin", "closing"),  # no message after a drain
        (("finish",), "answered", "closing"),
        (("lost",), "lost", "closed"),
        (("lost",), "begin", "closed"),
    ],
)
def test_a_phase_transition_it_does_not_have_raises(steps: tuple[str, ...], event: str, state: str) -> None:
    s = AppState()
    for step in steps:
        getattr(s, step)()
    with pytest.raises(InvalidTransition, match=f"{event} is not a transition from state '{state}'"):
        getattr(s, event)()


def test_an_intake_transition_it_does_not_have_raises() -> None:
    s = AppState()
    with pytest.raises(InvalidTransition, match="drained is not a transition from state 'reading'"):
        s.drained()
    with pytest.raises(InvalidTransition, match="granted is not a transition from state 'reading'"):
        s.granted(full=False)
    s.fill()
    with pytest.raises(InvalidTransition, match="fill is not a transition from state 'full'"):
        s.fill()
    s.starve()
    with pytest.raises(InvalidTransition, match="starve is not a transition from state 'starved'"):
        s.starve()
    with pytest.raises(InvalidTransition, match="drained is not a transition from state 'starved'"):
        s.drained()
