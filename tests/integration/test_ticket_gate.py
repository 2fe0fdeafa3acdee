"""The ticket gate under the real runtime (``drive``) with a scripted in-process attempter standing in for a
protocol adapter, and the prober's timer on a real loop: refusals reach the engine as overloaded outcomes
whose payload is the Refusal (never handed to the adapter to discard), a retry that succeeds after one
hands its ticket back, and the timer rests while the upstream is idle. Waits are on events or polls with
a generous bound."""

from __future__ import annotations

import asyncio

from sidecar.admission import Kind
from sidecar.admission.refusal import Refusal
from sidecar.config.schema import ConcurrencyConfig
from sidecar.gates.concurrency import UpstreamConcurrency
from sidecar.gates.ticket_gate import TicketGate
from sidecar.policy import BackoffSpec, Jitter, OutcomeClass, Reason, RetryPolicy
from sidecar.runtime import drive
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
