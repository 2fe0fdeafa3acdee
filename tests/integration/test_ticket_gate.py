"""The ticket gate under the real runtime (``drive``) with a scripted in-process attempter standing in for a
protocol adapter, and the prober's timer on a real loop: refusals reach the engine as overloaded outcomes
whose payload is the Refusal (never handed to the adapter to discard), a retry that succeeds after one
hands its ticket back, the timer rests while the upstream is idle, and an abandoned attempt keeps its ticket
until the upstream can be taken to have let the request go. Waits are on events or polls with
a generous bound."""

from __future__ import annotations

import asyncio

from sidecar.admission import Kind
from sidecar.admission.refusal import Refusal
from sidecar.config.schema import ConcurrencyConfig
from sidecar.gates.concurrency import UpstreamConcurrency
from sidecar.gates.ticket_gate import TicketGate
from sidecar.policy import BackoffSpec, Finish, Jitter, OutcomeClass, Reason, RetryPolicy
from sidecar.runtime import NULL_OBSERVER, AttemptContext, CallbackAttempter, CallOwner, Driver, drive
from sidecar.telemetry.metrics import Metrics
from tests.metrics import until

from .test_runtime import OK, Script, make_call


def tickets(**kw: object) -> UpstreamConcurrency:
    return UpstreamConcurrency("u", ConcurrencyConfig(**{"mode": "fixed", "initial": 2, **kw}))


async def test_a_refused_attempt_is_an_overloaded_outcome_carrying_the_refusal() -> None:
    loop = asyncio.get_running_loop()
    tk = tickets(max_queue=0)
    held = tk.endpoint("a:1", loop).acquire(Kind.READ, loop.time(), float("inf"))  # the one read ticket
    assert held.admitted
    script = Script(OK)
    d = await drive(
        make_call(RetryPolicy(max_attempts=1), ("a:1",)), script, gate=TicketGate(tk, Kind.READ, loop)
    )
    assert d.finish.reason is Reason.NOT_RETRYABLE or d.finish.reason is Reason.ATTEMPTS_EXHAUSTED
    assert d.finish.outcome is not None and d.finish.outcome.cls is OutcomeClass.OVERLOADED
    assert isinstance(d.payload, Refusal) and d.payload.reason.value == "queue-full"
    assert script.sent == []  # never sent


async def test_a_retry_after_a_refusal_gets_the_ticket_and_the_refusal_is_not_discarded_by_the_adapter() -> (
    None
):
    loop = asyncio.get_running_loop()
    tk = tickets(max_queue=0)
    ep = tk.endpoint("a:1", loop)
    ep.acquire(Kind.READ, loop.time(), float("inf"))
    gate = TicketGate(tk, Kind.READ, loop)
    script = Script(OK, OK)
    # The first attempt is refused; the ticket comes back before the backoff's retry.
    loop.call_soon(ep.release, Kind.READ)
    backoff = BackoffSpec(initial=0.05, max=0.05, multiplier=1.0, jitter=Jitter.NONE)
    d = await drive(make_call(RetryPolicy(max_attempts=2, backoff=backoff), ("a:1",)), script, gate=gate)
    assert d.finish.reason is Reason.SUCCESS and d.finish.attempts == 2
    assert script.discarded == []  # the refusals held nothing: never given to the adapter
    assert ep.pool(Kind.READ).in_use == 0  # the successful attempt's ticket is back


async def test_the_prober_timer_rests_while_idle_and_wakes_with_the_next_attempt() -> None:
    loop = asyncio.get_running_loop()
    tk = UpstreamConcurrency("u", ConcurrencyConfig(mode="probing", initial=4, min=2, max=8, interval="10ms"))
    ep = tk.endpoint("a:1", loop)
    assert tk.running
    assert ep.acquire(Kind.WRITE, loop.time(), float("inf")).admitted
    ep.release(Kind.WRITE)
    await until(lambda: not tk.running, "the timer resting")
    tk.endpoint("a:1", loop)
    assert tk.running
    await until(lambda: not tk.running, "resting again")


# -- abandoned attempts keep their ticket until the upstream can be taken to have let the request go -------


class _Abandoning(CallbackAttempter):
    """A callback attempter whose attempts hang until cancelled; on cancel, it says the upstream let go
    (nothing was sent) when told to, and can answer late (after the cancel) when told to."""

    def __init__(self, sent: bool = True) -> None:
        self.sent = sent
        self.ctx: dict[int, AttemptContext] = {}
        self.cancelled: list[int] = []
        self.discarded: list[object] = []

    def start(self, cmd, ctx) -> None:  # noqa: ANN001
        self.ctx[cmd.attempt] = ctx

    def cancel(self, attempt: int) -> None:
        self.cancelled.append(attempt)
        if not self.sent:
            self.ctx[attempt].let_go()

    def discard(self, payload: object) -> None:
        self.discarded.append(payload)


def _metrics(tk: UpstreamConcurrency) -> Metrics:
    m = Metrics()
    m.watch_concurrency(tk.name, tk)
    return m


def _driver(tk: UpstreamConcurrency, attempter: _Abandoning, loop: asyncio.AbstractEventLoop) -> Driver:
    class Owner(CallOwner):
        def finished(self, finish: Finish, payload: object) -> None:
            pass

    call = make_call(RetryPolicy(max_attempts=1), ("a:1",))
    return Driver(call, attempter, NULL_OBSERVER, Owner(), loop, gate=TicketGate(tk, Kind.READ, loop))


async def test_an_abandoned_attempt_keeps_its_ticket_as_long_again_at_most_abandoned_hold() -> None:
    loop = asyncio.get_running_loop()
    tk = tickets(abandoned_hold="50ms")
    attempter = _Abandoning()
    d = _driver(tk, attempter, loop)
    d.start(loop.time() - 10.0)  # the attempt has been outstanding 10 s: held 10 s more at most, 50 ms here
    pool = tk.endpoints["a:1"].pool(Kind.READ)
    assert (pool.in_use, pool.abandoned) == (1, 0)
    d.client_gone()  # the attempt is cancelled: its request may still be at the upstream
    assert attempter.cancelled == [1]
    assert (pool.in_use, pool.abandoned, pool.available) == (1, 1, 0)
    families = {f.name: f for f in _metrics(tk).registry.collect()}
    in_use = {
        s.labels["abandoned"]: s.value
        for s in families["sidecar_concurrency_in_use"].samples
        if s.labels["pool"] == "read"
    }
    assert in_use == {"true": 1.0, "false": 0.0}
    await until(lambda: pool.in_use == 0, "the ticket back after the hold")
    assert pool.abandoned == 0


async def test_a_ticket_abandoned_early_is_held_no_longer_than_it_was_outstanding() -> None:
    loop = asyncio.get_running_loop()
    tk = tickets(abandoned_hold="60s")
    d = _driver(tk, _Abandoning(), loop)
    d.start(loop.time() - 0.05)  # outstanding 50 ms when abandoned: held 50 ms more, not 60 s
    d.client_gone()
    pool = tk.endpoints["a:1"].pool(Kind.READ)
    assert pool.abandoned == 1
    await until(lambda: pool.in_use == 0, "the ticket back", bound=5.0)


async def test_an_attempt_cancelled_before_anything_was_sent_lets_go_at_once() -> None:
    loop = asyncio.get_running_loop()
    tk = tickets(abandoned_hold="60s")
    d = _driver(tk, _Abandoning(sent=False), loop)
    d.start(loop.time() - 100.0)
    d.client_gone()
    pool = tk.endpoints["a:1"].pool(Kind.READ)
    assert (pool.in_use, pool.abandoned) == (0, 0)


async def test_an_answer_that_arrives_after_the_cancel_is_discarded_and_lets_go() -> None:
    loop = asyncio.get_running_loop()
    tk = tickets(abandoned_hold="60s")
    attempter = _Abandoning()
    d = _driver(tk, attempter, loop)
    d.start(loop.time() - 100.0)
    d.client_gone()
    pool = tk.endpoints["a:1"].pool(Kind.READ)
    assert pool.abandoned == 1
    attempter.ctx[1].answer(OK, "late answer")  # the upstream answered after all: it let the request go
    assert attempter.discarded == ["late answer"]
    assert (pool.in_use, pool.abandoned) == (0, 0)


async def test_with_no_hold_the_ticket_comes_back_with_the_cancel() -> None:
    loop = asyncio.get_running_loop()
    tk = tickets(abandoned_hold="0s")
    d = _driver(tk, _Abandoning(), loop)
    d.start(loop.time() - 100.0)
    d.client_gone()
    pool = tk.endpoints["a:1"].pool(Kind.READ)
    assert (pool.in_use, pool.abandoned) == (0, 0)


async def test_an_answer_to_a_later_attempt_lets_the_abandoned_ones_before_it_go() -> None:
    """The endpoint answered an attempt sent after the abandoned one: it has moved past it (a queue serves in
    order), so the abandoned ticket comes back; one sent after the answered attempt stays held."""
    loop = asyncio.get_running_loop()
    tk = tickets(initial=8, abandoned_hold="60s")
    first, second, third = _Abandoning(), _Abandoning(), _Abandoning()
    a, b, c = (_driver(tk, x, loop) for x in (first, second, third))
    now = loop.time()
    a.start(now - 30.0)
    b.start(now - 20.0)
    c.start(now - 10.0)
    a.client_gone()
    c.client_gone()
    pool = tk.endpoints["a:1"].pool(Kind.READ)
    assert (pool.in_use, pool.abandoned) == (3, 2)
    second.ctx[1].answer(OK, "answer")  # sent 20 s ago: after the first, before the third
    assert (pool.in_use, pool.abandoned) == (1, 1)
