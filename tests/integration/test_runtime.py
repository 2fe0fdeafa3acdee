"""The asyncio runtime carrying out engine commands, with a scripted in-process attempter standing in for a
protocol adapter. Waits are on events; policies use zero or tiny delays, and assertions are about order and
counts, never durations."""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import pytest

from sidecar.policy import (
    BackoffSpec,
    Call,
    CancelAttempt,
    Decision,
    Finish,
    HedgingSpec,
    Jitter,
    Outcome,
    OutcomeClass,
    Reason,
    RetryPolicy,
    SendAttempt,
)
from sidecar.runtime import AttemptContext, AttemptResult, CallObserver, drive
from sidecar.upstream.balancer import Balancer

C = OutcomeClass
NO_WAIT = BackoffSpec(initial=0.0, max=0.0, multiplier=1.0, jitter=Jitter.NONE)


class Script:
    """An attempter whose attempts answer from a script: an Outcome, ``"hang"`` (wait until cancelled),
    or an exception to raise. Records what happened to each attempt."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.sent: list[SendAttempt] = []
        self.cancelled: list[int] = []
        self.discarded: list[Any] = []
        self.started = asyncio.Event()
        self.commit_on: int | None = None

    async def send(self, cmd: SendAttempt, ctx: AttemptContext) -> AttemptResult:
        self.sent.append(cmd)
        self.started.set()
        answer = self.answers[cmd.attempt - 1]
        try:
            if self.commit_on == cmd.attempt:
                ctx.commit()
            if answer == "hang":
                await asyncio.Event().wait()
            if isinstance(answer, Exception):
                raise answer
            return AttemptResult(answer, payload=f"response-{cmd.attempt}")
        except asyncio.CancelledError:
            self.cancelled.append(cmd.attempt)
            raise

    def discard(self, payload: Any) -> None:
        self.discarded.append(payload)


class Recorder(CallObserver):
    def __init__(self) -> None:
        self.events: list[Any] = []

    def attempt_started(self, cmd: SendAttempt) -> dict[str, str]:
        self.events.append(cmd)
        return {"traceparent": f"attempt-{cmd.attempt}"}

    def attempt_ended(self, attempt: int, outcome: Outcome) -> None:
        self.events.append(("ended", attempt, outcome.cls))

    def attempt_cancelled(self, cmd: CancelAttempt) -> None:
        self.events.append(cmd)

    def decision(self, d: Decision) -> None:
        self.events.append(d)

    def finished(self, f: Finish) -> None:
        self.events.append(f)


def make_call(policy: RetryPolicy, endpoints=("a:1", "b:2"), deadline: float = math.inf) -> Call:
    loop = asyncio.get_running_loop()
    return Call(
        policy,
        picker=Balancer(list(endpoints)),
        rand=random.Random(1).random,
        deadline=loop.time() + deadline if math.isfinite(deadline) else deadline,
    )


def fail(cls: OutcomeClass = C.UNAVAILABLE) -> Outcome:
    return Outcome(cls)


OK = Outcome(C.SUCCESS)


async def test_retries_until_success_and_discards_the_failed_responses() -> None:
    script = Script(fail(), fail(), OK)
    call = make_call(RetryPolicy(max_attempts=3, backoff=NO_WAIT))
    d = await drive(call, script)
    assert d.finish.reason is Reason.SUCCESS and d.finish.attempt == 3 and d.finish.attempts == 3
    assert d.payload == "response-3"
    assert sorted(script.discarded) == ["response-1", "response-2"]


async def test_gives_up_with_the_last_response_when_attempts_run_out() -> None:
    script = Script(fail(), fail(C.OVERLOADED))
    d = await drive(make_call(RetryPolicy(max_attempts=2, backoff=NO_WAIT)), script)
    assert d.finish.reason is Reason.ATTEMPTS_EXHAUSTED
    assert d.payload == "response-2" and script.discarded == ["response-1"]


async def test_backoff_wait_happens_between_attempts() -> None:
    script = Script(fail(), OK)
    policy = RetryPolicy(max_attempts=2, backoff=BackoffSpec(0.005, 0.005, 1.0, Jitter.NONE))
    rec = Recorder()
    d = await drive(make_call(policy), script, rec)
    assert d.finish.reason is Reason.SUCCESS
    decisions = [e for e in rec.events if isinstance(e, Decision)]
    assert decisions[0].reason is Reason.RETRY and decisions[0].delay == pytest.approx(0.005)


async def test_per_try_timeout_cancels_the_attempt_and_the_retry_succeeds() -> None:
    script = Script("hang", OK)
    policy = RetryPolicy(
        max_attempts=2, backoff=NO_WAIT, per_try_timeout=0.01, retry_on=frozenset({C.TIMEOUT, C.UNAVAILABLE})
    )
    rec = Recorder()
    d = await drive(make_call(policy), script, rec)
    assert d.finish.reason is Reason.SUCCESS and d.finish.attempt == 2
    assert script.cancelled == [1]
    assert CancelAttempt(1, Reason.PER_TRY_TIMEOUT) in rec.events


async def test_deadline_during_an_attempt_cancels_it_and_finishes_with_deadline() -> None:
    script = Script("hang")
    d = await drive(make_call(RetryPolicy(max_attempts=3), deadline=0.02), script)
    assert d.finish.reason is Reason.DEADLINE and d.payload is None
    assert script.cancelled == [1]


async def test_client_going_away_cancels_the_attempt() -> None:
    script = Script("hang")
    rec = Recorder()
    task = asyncio.create_task(drive(make_call(RetryPolicy()), script, rec))
    await script.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert script.cancelled == [1]
    assert any(isinstance(e, Finish) and e.reason is Reason.CANCELLED for e in rec.events)


async def test_an_attempter_bug_is_a_fatal_outcome_not_a_hang() -> None:
    script = Script(RuntimeError("boom"))
    d = await drive(make_call(RetryPolicy()), script)
    assert d.finish.reason is Reason.NOT_RETRYABLE
    assert d.finish.outcome is not None and d.finish.outcome.cls is C.FATAL


async def test_trace_headers_from_the_observer_reach_the_attempt() -> None:
    seen: list[dict[str, str]] = []

    class Headers(Script):
        async def send(self, cmd: SendAttempt, ctx: AttemptContext) -> AttemptResult:
            seen.append(dict(ctx.headers))
            return await super().send(cmd, ctx)

    await drive(make_call(RetryPolicy(backoff=NO_WAIT)), Headers(fail(), OK), Recorder())
    assert seen == [{"traceparent": "attempt-1"}, {"traceparent": "attempt-2"}]


HEDGE = RetryPolicy(
    max_attempts=3, hedging=HedgingSpec(max_attempts=3, delay=0.0, non_fatal=frozenset({C.UNAVAILABLE}))
)


async def test_hedging_first_success_wins_and_the_others_are_cancelled() -> None:
    all_out = asyncio.Event()

    class Late(Script):
        async def send(self, cmd: SendAttempt, ctx: AttemptContext) -> AttemptResult:
            if cmd.attempt == 2:
                await all_out.wait()  # answer once every copy is out
            elif cmd.attempt == 3:
                all_out.set()
            return await super().send(cmd, ctx)

    script = Late("hang", OK, "hang")
    d = await drive(make_call(HEDGE, endpoints=("a:1", "b:2", "c:3")), script)
    assert d.finish.reason is Reason.SUCCESS and d.payload == "response-2"
    await asyncio.sleep(0)  # let the cancelled tasks run their cancellation
    assert sorted(script.cancelled) == [1, 3]
    assert len({c.endpoint for c in script.sent}) == 3  # distinct endpoints


async def test_hedging_all_fail_delivers_the_last_failure() -> None:
    script = Script(fail(), fail(), fail())
    d = await drive(make_call(HEDGE, endpoints=("a:1", "b:2", "c:3")), script)
    assert d.finish.reason is Reason.ATTEMPTS_EXHAUSTED and d.finish.attempts == 3
    assert d.payload is not None and len(script.discarded) == 2


async def test_hedging_commit_cancels_the_other_attempts() -> None:
    class Slow(Script):
        async def send(self, cmd: SendAttempt, ctx: AttemptContext) -> AttemptResult:
            if cmd.attempt == 1:
                self.sent.append(cmd)
                await self.all_out.wait()
                ctx.commit()  # response headers arrived on attempt 1: it is the one
                await asyncio.sleep(0)
                return AttemptResult(Outcome(C.UNAVAILABLE), "response-1")
            if cmd.attempt == 3:
                self.all_out.set()
            return await super().send(cmd, ctx)

    script = Slow(None, "hang", "hang")
    script.all_out = asyncio.Event()
    d = await drive(make_call(HEDGE, endpoints=("a:1", "b:2", "c:3")), script)
    assert d.finish.reason is Reason.COMMITTED and d.payload == "response-1"
    await asyncio.sleep(0)
    assert sorted(script.cancelled) == [2, 3]


# -- a bug is contained to its request (issue 11, item 9) --------------------------------------------------
class Broken(Recorder):
    """An observer whose ``decision`` hook raises: a telemetry bug."""

    def decision(self, d: Decision) -> None:
        raise RuntimeError("telemetry bug")

    def describe(self) -> str:
        return "the broken request"


async def test_an_observer_hook_that_raises_ends_only_its_request_with_an_internal_error(caplog) -> None:  # noqa: ANN001
    policy = RetryPolicy(max_attempts=3, backoff=NO_WAIT)
    broken = drive(make_call(policy), Script(Outcome(C.UNAVAILABLE), Outcome(C.SUCCESS)), Broken())
    healthy = drive(make_call(policy), Script(Outcome(C.UNAVAILABLE), Outcome(C.SUCCESS)), Recorder())
    bad, good = await asyncio.gather(broken, healthy)
    assert bad.finish.reason is Reason.INTERNAL and bad.payload is None
    assert good.finish.reason is Reason.SUCCESS and good.payload == "response-2"
    failures = [r for r in caplog.records if "ended by an internal error" in r.getMessage()]
    assert len(failures) == 1 and "the broken request" in failures[0].getMessage()


async def test_a_timer_callback_that_raises_does_not_strand_the_others_due_in_the_same_tick() -> None:
    from sidecar.timers import Timers

    loop = asyncio.get_running_loop()
    timers = Timers(loop)
    fired: list[str] = []
    done = asyncio.Event()
    at = loop.time() + 0.001

    def boom() -> None:
        raise RuntimeError("a wake-up's bug")

    timers.call_at(at, lambda: fired.append("before"))
    timers.call_at(at, boom)
    timers.call_at(at, lambda: fired.append("after") or done.set())
    await done.wait()
    assert fired == ["before", "after"]
    assert len(timers) == 0
