"""Whose deadline it is, and when the clocks start (issue 11's rules).

- The client's deadline counts from arrival (userver); the sidecar's own bound (the policy's default, used
  when the client sent none) and the per-try timeout start when the whole request is upstream (Envoy).
- A deadline the client did not set ends the request with the last upstream answer, unchanged
  (``Finish.own_deadline``); the client's own gets the protocol's deadline answer (adapters).
"""

from sidecar.policy import (
    REQUEST_COMPLETE,
    START,
    AttemptEnded,
    CancelAttempt,
    Finish,
    Outcome,
    OutcomeClass,
    Reason,
    RetryPolicy,
    SendAttempt,
    Wake,
)
from tests.unit.playbook import INF, OK, UNAVAILABLE, Driver, StrictBalancer, make_call, pushback

C = OutcomeClass
POLICY = RetryPolicy(per_try_timeout=2.0, deadline=10.0)


def test_an_upload_still_arriving_has_no_per_try_timer_and_it_starts_when_the_request_is_complete() -> None:
    d = Driver(make_call(POLICY, deadline=INF, default_timeout=10.0, request_complete=False))
    out = d(START, 0.0)
    (send,) = [c for c in out if isinstance(c, SendAttempt)]
    assert send.timeout == INF and send.whole_deadline  # nothing to propagate: no deadline runs yet
    assert [c for c in out if isinstance(c, Wake)] == []  # no timer at all while the body flows
    # The upload takes 30 s (far past the per-try timeout and the default deadline): nothing fires.
    assert d(REQUEST_COMPLETE, 30.0) == [Wake(32.0)]
    out = d.tick()
    assert out[0] == CancelAttempt(1, Reason.PER_TRY_TIMEOUT)
    assert d.call.deadline == 40.0  # the sidecar's own bound: 10 s from completion


def test_the_clients_deadline_counts_from_arrival_even_while_the_body_arrives() -> None:
    d = Driver(make_call(POLICY, deadline=5.0, default_timeout=10.0, request_complete=False))
    (send,) = [c for c in d(START, 0.0) if isinstance(c, SendAttempt)]
    assert send.timeout == 5.0 and send.whole_deadline  # what remains of the client's deadline
    assert d.wake == 5.0
    assert d(REQUEST_COMPLETE, 1.0) == [Wake(3.0)]  # per-try (2 s) from completion, sooner than the deadline
    finish = d.call.handle(REQUEST_COMPLETE, 1.5)  # a second completion changes nothing
    assert finish == []


def test_a_complete_request_starts_its_default_deadline_and_per_try_timer_at_start() -> None:
    d = Driver(make_call(POLICY, deadline=INF, default_timeout=10.0))
    (send,) = [c for c in d(START, 3.0) if isinstance(c, SendAttempt)]
    assert (send.timeout, send.whole_deadline) == (2.0, False)
    assert d.wake == 5.0 and d.call.deadline == 13.0


def test_a_pushback_past_the_sidecars_own_deadline_delivers_the_upstream_answer() -> None:
    d = Driver(make_call(POLICY, deadline=INF, default_timeout=10.0))
    d(START, 0.0)
    out = d(AttemptEnded(1, pushback(UNAVAILABLE, 60.0)), 0.1)
    finish = out[-1]
    assert finish == Finish(Reason.DEADLINE, 1, pushback(UNAVAILABLE, 60.0), 1, own_deadline=True)


def test_a_pushback_past_the_clients_deadline_is_the_clients_deadline() -> None:
    d = Driver(make_call(POLICY, deadline=10.0))
    d(START, 0.0)
    finish = d(AttemptEnded(1, pushback(UNAVAILABLE, 60.0)), 0.1)[-1]
    assert finish.reason is Reason.DEADLINE and finish.own_deadline is False


def test_no_deadline_at_all_when_the_client_sent_none_and_the_policy_has_none() -> None:
    d = Driver(make_call(RetryPolicy(per_try_timeout=INF, deadline=INF), deadline=INF))
    (send,) = [c for c in d(START, 0.0) if isinstance(c, SendAttempt)]
    assert send.timeout == INF
    assert d.wake == INF
    assert d(AttemptEnded(1, OK), 1e6)[-1].reason is Reason.SUCCESS


class Seen(StrictBalancer):
    """Records what the engine tells the picker about each attempt's result."""

    def __init__(self) -> None:
        super().__init__(("a", "b"))
        self.seen: list[tuple[str, OutcomeClass, float]] = []

    def observe(self, endpoint: str, outcome: OutcomeClass, now: float) -> None:
        self.seen.append((endpoint, outcome, now))


def test_the_picker_observes_every_result_per_try_timeouts_included() -> None:
    picker = Seen()
    call = make_call(POLICY, balancer=picker, deadline=INF, default_timeout=10.0)
    d = Driver(call)
    d(START, 0.0)
    d(AttemptEnded(1, UNAVAILABLE), 0.5)
    d.tick()  # the retry after its backoff
    d.tick()  # attempt 2 hits its per-try timeout
    (first, _, at1), (second, cls2, at2) = picker.seen
    assert (at1, cls2) == (0.5, C.TIMEOUT) and first != second and at2 > at1


def test_the_sidecars_own_refusal_is_not_observed_but_its_endpoint_is_avoided() -> None:
    picker = Seen()
    call = make_call(POLICY, balancer=picker, deadline=INF, default_timeout=10.0)
    d = Driver(call)
    (first,) = [c for c in d(START, 0.0) if isinstance(c, SendAttempt)]
    d(AttemptEnded(1, Outcome(C.OVERLOADED, detail="concurrency queue-full", local=True)), 0.5)
    # the retry after its backoff, elsewhere: the endpoint is at its limit
    (retry,) = [c for c in d.tick() if isinstance(c, SendAttempt)]
    assert picker.seen == []  # outlier detection never counts the sidecar's own "no"
    assert retry.endpoint != first.endpoint


class Electing(StrictBalancer):
    """No endpoint fits for a while (a replica set electing a primary), then one does."""

    def __init__(self, none_until: float, give_up_at: float = INF) -> None:
        super().__init__(("a", "b"))
        self.none_until = none_until
        self.give_up_at = give_up_at
        self.asked: list[float] = []

    def pick(self, now, rand, candidates=None, avoid=(), deprioritized=()):  # noqa: ANN001, ANN201
        if 0 < now < self.none_until:
            return None
        return super().pick(now, rand, candidates, avoid, deprioritized)

    def ready_at(self, now: float) -> float:
        self.asked.append(now)
        return now + 0.1 if now < self.give_up_at else INF


def test_a_retry_that_finds_no_endpoint_yet_waits_for_one_on_the_engines_timer() -> None:
    picker = Electing(none_until=0.35)
    d = Driver(make_call(POLICY, balancer=picker, deadline=5.0))
    d(START, 0.0)
    d(AttemptEnded(1, UNAVAILABLE), 0.1)  # reported at once by the attempter
    sends = []
    while not sends:
        sends = [c for c in d.tick() if isinstance(c, SendAttempt)]
    assert picker.asked and all(t < 0.35 for t in picker.asked)  # asked again until a server fitted
    assert sends[0].attempt == 2 and d.now >= 0.35


def test_a_retry_with_no_endpoint_ever_ends_no_endpoint() -> None:
    picker = Electing(none_until=INF, give_up_at=0.3)
    d = Driver(make_call(POLICY, balancer=picker, deadline=5.0))
    d(START, 0.0)
    d(AttemptEnded(1, UNAVAILABLE), 0.1)
    finish = None
    while finish is None:
        finish = next((c for c in d.tick() if isinstance(c, Finish)), None)
    assert finish.reason is Reason.NO_ENDPOINT and d.now >= 0.3


def test_a_first_attempt_that_finds_no_endpoint_yet_waits_for_one_too() -> None:
    """One way to wait for a fitting server: the first attempt asks the picker when to look again, as a
    retry does (MongoDB during an election; every other picker answers ``inf``: no-endpoint at once)."""
    picker = Electing(none_until=0.25)
    d = Driver(make_call(POLICY, balancer=picker, deadline=5.0))
    assert not [c for c in d(START, 0.01) if isinstance(c, SendAttempt)]
    sends = []
    while not sends:
        sends = [c for c in d.tick() if isinstance(c, SendAttempt)]
    assert picker.asked[0] == 0.01 and sends[0].attempt == 1 and d.now >= 0.25


def test_a_first_attempt_with_no_endpoint_and_a_picker_that_expects_none_ends_at_once() -> None:
    picker = Electing(none_until=INF, give_up_at=0.0)
    d = Driver(make_call(POLICY, balancer=picker, deadline=5.0))
    (finish,) = [c for c in d(START, 0.01) if isinstance(c, Finish)]
    assert finish.reason is Reason.NO_ENDPOINT


def test_a_wait_for_an_endpoint_that_would_cross_the_deadline_ends_on_the_deadline() -> None:
    """As for a backoff: the wait would outlive the request, so it ends now, as a deadline (MongoDB answers
    the app's maxTimeMS with code 50, not "no server fits")."""
    picker = Electing(none_until=INF)
    d = Driver(make_call(POLICY, balancer=picker, deadline=0.25))
    finish = next((c for c in d(START, 0.01) if isinstance(c, Finish)), None)
    while finish is None:
        finish = next((c for c in d.tick() if isinstance(c, Finish)), None)
    assert finish.reason is Reason.DEADLINE and d.now < 0.25 and not d.sends
