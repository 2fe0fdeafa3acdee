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


def test_the_app_login_walks_its_states() -> None:
    """``login.Login``: NONE -> CONVERSING -> DONE through a real SCRAM exchange (our client against the
    sidecar's server side), a failed proof back to NONE, an unknown user failing only at the end."""
    from sidecar.adapters.mongo.login import AppUser, AppUsers, Login, LoginFailed, Phase
    from sidecar.adapters.mongo.scram import ScramClient

    users = AppUsers([AppUser("orders", "pw-orders", "admin")])
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-1"):
        login = Login(users)
        assert login.phase is Phase.NONE and not login.allows("find") and login.allows("ping")
        client = ScramClient(mechanism, "orders", "pw-orders")
        step = login.start("admin", mechanism, client.first(), skip_empty=False)
        assert login.phase is Phase.CONVERSING and not step.done
        step = login.proceed(step.conversation, client.final(step.payload))
        client.verify(step.payload)
        assert not step.done and login.phase is Phase.CONVERSING  # the empty last step is still to come
        assert login.proceed(step.conversation, b"").done
        assert login.phase is Phase.DONE and login.user == AppUser("orders", "pw-orders", "admin")
        assert login.allows("find")

    for user, password in [("orders", "wrong"), ("nobody", "pw-orders")]:
        login = Login(users)
        client = ScramClient("SCRAM-SHA-256", user, password)
        step = login.start("admin", "SCRAM-SHA-256", client.first(), skip_empty=True)  # no hint yet
        with pytest.raises(LoginFailed, match=f"admin.{user}"):
            login.proceed(step.conversation, client.final(step.payload))
        assert login.phase is Phase.NONE and login.user is None
    with pytest.raises(LoginFailed):  # saslContinue with no exchange begun: the app's mistake
        Login(users).proceed(1, b"")
