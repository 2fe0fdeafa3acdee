"""The error every adapter state machine raises for a transition it does not have (the HTTP client
connection's and upstream connection's ``State``): a bug in the sidecar, never a client's doing. It is
raised, not handled, so that a test that drives a connection into it fails loudly."""


class InvalidTransition(Exception):
    def __init__(self, machine: str, state: str, event: str) -> None:
        super().__init__(f"{machine}: {event} is not a transition from state {state!r}")
        self.machine = machine
        self.state = state
        self.event = event
