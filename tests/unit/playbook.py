"""A small harness for the sans-IO engine: events in, commands out, on a clock moved by hand.

``Driver`` feeds one event at a time and keeps a transcript (mitmproxy's ``tutils.Playbook`` habit).
``run`` plays a whole call from a script of attempt results, jumping the clock to each ``Wake``.
Both check, whenever a call finishes, that ``Finish`` came last and that the balancer's outstanding counts
are back where they were when the call began.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

from sidecar.policy import (
    START,
    SUCCESS,
    TICK,
    AttemptEnded,
    Call,
    CancelAttempt,
    Decision,
    EndpointPicker,
    Event,
    Finish,
    Outcome,
    OutcomeClass,
    Pushback,
    RetryPolicy,
    SendAttempt,
    Wake,
    make_throttle,
)
from sidecar.upstream.balancer import Balancer

INF = math.inf
C = OutcomeClass

OK = SUCCESS
CONNECT = Outcome(C.CONNECT_FAILURE)
RESET = Outcome(C.RESET)
TIMEOUT = Outcome(C.TIMEOUT)
UNAVAILABLE = Outcome(C.UNAVAILABLE)
OVERLOADED = Outcome(C.OVERLOADED)
FATAL = Outcome(C.FATAL)


def pushback(outcome: Outcome, delay: float | None) -> Outcome:
    """``outcome`` carrying a server pushback: wait ``delay`` seconds, or (None) do not retry."""
    return outcome._replace(pushback=Pushback(delay))


def scripted(*values: float):
    """A ``rand`` returning ``values`` in order; drawing more than that fails the test."""
    it = iter(values)

    def rand() -> float:
        v = next(it, None)
        assert v is not None, "rand() drawn more often than scripted"
        return v

    return rand


class StrictBalancer(EndpointPicker):
    """A Balancer that fails the test when an endpoint is released more often than it was taken (it wraps
    one: the compiled Balancer cannot be subclassed by test code)."""

    def __init__(self, endpoints: Sequence[str], **kw) -> None:
        self.inner = Balancer(endpoints, **kw)

    def pick(self, now, rand, candidates=None, avoid=(), deprioritized=()):  # noqa: ANN001, ANN201
        return self.inner.pick(now, rand, candidates, avoid, deprioritized)

    def started(self, endpoint: str) -> None:
        self.inner.started(endpoint)

    def finished(self, endpoint: str) -> None:
        assert self.inner.outstanding.get(endpoint, 0) > 0, f"{endpoint!r} released more often than taken"
        self.inner.finished(endpoint)

    def penalize(self, endpoint: str, now: float) -> None:
        self.inner.penalize(endpoint, now)

    def __getattr__(self, name: str):  # noqa: ANN204 - everything else is the Balancer's
        return getattr(self.inner, name)


def make_call(
    policy: RetryPolicy | None = None,
    *,
    endpoints: Sequence[str] = ("a", "b", "c"),
    balancer: Balancer | None = None,
    rand=None,
    deadline: float = 10.0,
    throttle=None,
    **kw,
) -> Call:
    """A Call with test defaults: three endpoints, a seeded rand, deadline at t=10, the policy's own bucket."""
    policy = policy or RetryPolicy()
    if throttle is None and policy.throttle is not None:
        throttle = make_throttle(policy.throttle)
    return Call(
        policy,
        picker=balancer if balancer is not None else StrictBalancer(endpoints),
        rand=rand or random.Random(7).random,
        deadline=deadline,
        throttle=throttle,
        **kw,
    )


class Driver:
    """Feeds events to one Call at times set by hand; ``log`` is the transcript of (time, event or command)."""

    def __init__(self, call: Call, now: float = 0.0) -> None:
        self.call = call
        self.now = now
        self.wake = INF  # the latest Wake not yet consumed by a tick
        self.log: list[tuple[float, object]] = []
        self._outstanding = self._busy()

    def __call__(self, event: Event, at: float | None = None) -> list:
        if at is not None:
            assert at >= self.now, "time only runs forward"
            self.now = at
        self.log.append((self.now, event))
        out = self.call.handle(event, self.now)
        self.log.extend((self.now, cmd) for cmd in out)
        for cmd in out:
            if isinstance(cmd, Wake):
                self.wake = cmd.at
        if any(isinstance(cmd, Finish) for cmd in out):
            assert isinstance(out[-1], Finish), f"Finish must come last: {out}"
            assert self._busy() == self._outstanding, "an attempt was never released"
        return out

    def _busy(self) -> dict[str, int]:
        return {e: n for e, n in self.call.picker.outstanding.items() if n}

    def tick(self) -> list:
        """Jump to the pending Wake and feed the Tick the runtime would."""
        assert self.wake < INF, "no Wake pending"
        at, self.wake = self.wake, INF
        return self(TICK, at)

    def timed(self, kind: type) -> list[tuple[float, object]]:
        return [(t, x) for t, x in self.log if isinstance(x, kind)]

    def all(self, kind: type) -> list:
        return [x for _, x in self.log if isinstance(x, kind)]

    @property
    def sends(self) -> list[SendAttempt]:
        return self.all(SendAttempt)

    @property
    def decisions(self) -> list[Decision]:
        return self.all(Decision)

    @property
    def cancels(self) -> list[CancelAttempt]:
        return self.all(CancelAttempt)

    @property
    def finish(self) -> Finish:
        (finish,) = self.all(Finish)
        return finish

    @property
    def finished_at(self) -> float:
        ((t, _),) = self.timed(Finish)
        return t


Step = Outcome | tuple[float, Outcome] | None


def run(
    call: Call, script: Sequence[Step], *, now: float = 0.0, events: Iterable[tuple[float, Event]] = ()
) -> Driver:
    """Start ``call`` and play it to its Finish.

    Attempt n answers ``script[n-1]``: an Outcome (the moment it is sent), ``(after, outcome)`` (``after``
    seconds after it was sent) or None/missing (never). ``events`` are extra ``(at, event)`` pairs.
    Otherwise the clock jumps to the pending Wake. Things due at the same time go Wake, extra event, answer.
    A cancelled attempt's answer still arrives, late, and must change nothing.
    """
    d = Driver(call, now)
    answers: dict[int, tuple[float, Outcome]] = {}
    extra = sorted(events, key=lambda e: e[0])
    cancelled: set[int] = set()

    def note(out: list) -> None:
        for cmd in out:
            if isinstance(cmd, SendAttempt) and cmd.attempt <= len(script):
                step = script[cmd.attempt - 1]
                if step is not None:
                    after, outcome = (0.0, step) if isinstance(step, Outcome) else step
                    answers[cmd.attempt] = (d.now + after, outcome)
            elif isinstance(cmd, CancelAttempt):
                cancelled.add(cmd.attempt)

    note(d(START))
    for _ in range(1000):
        if call.finished:
            return d
        answer = min(answers.items(), key=lambda kv: (kv[1][0], kv[0]), default=None)
        t_answer = answer[1][0] if answer else INF
        t_extra = extra[0][0] if extra else INF
        if d.wake <= min(t_answer, t_extra) and d.wake < INF:
            note(d.tick())
        elif extra and t_extra <= t_answer:
            at, event = extra.pop(0)
            note(d(event, max(at, d.now)))
        elif answer:
            n, (at, outcome) = answer
            del answers[n]
            out = d(AttemptEnded(n, outcome), at)
            assert n not in cancelled or out == [], f"late answer of cancelled attempt {n} did {out}"
            note(out)
        else:
            raise AssertionError(f"call is stuck: no answer due and no Wake pending\n{d.log}")
    raise AssertionError("call did not finish in 1000 steps")
