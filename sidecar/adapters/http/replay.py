"""The request body on its way from the client to the attempts: streamed, and kept for replay.

Chunks are pushed to every attempt sending the body as they arrive (no copy, no task), and kept in the
adapters' shared :class:`~sidecar.adapters.replay.ReplayBuffer` so that a retry or hedge can send them
again, up to ``limit`` bytes (the policy's ``replay_buffer``). Past the limit the body is no longer
replayable: its owner is told (``BodyOwner.body_overflowed``: the engine hears ``buffer-exceeded``), the
attempt in flight keeps streaming, and what it has sent is let go. A body whose declared length is over the limit is not replayable
from the start.

Flow control: reading from the client pauses while an attempt's upstream socket is backed up, or while
more than ``WATERMARK`` bytes wait with no attempt to take them (before connecting, during a backoff), or
while the process-wide buffer budget is full (``limits.max_buffered_bytes``): the chunks kept count against
it until they are let go (``release`` at the request's end), and reading resumes when another request lets
go of some. A body stalled that way is cut by ``request_body_timeout`` as any stalled body is.
"""

from __future__ import annotations

from typing import Final, Protocol

from ...buffer_budget import BufferBudget
from ..replay import ReplayBuffer

WATERMARK: Final = 256 * 1024


class BodySink(Protocol):
    def body_data(self, data: bytes) -> None: ...
    def body_end(self) -> None: ...


class BodyOwner(Protocol):
    """Who hears what becomes of a body (the request forwarding it, ``request.Forwarding``): installed in one
    place, ``RequestBody.owner``, once the request is admitted."""

    def body_attached(
        self,
    ) -> None: ...  # the first attempt takes it (a client that said Expect: 100-continue)
    def body_overflowed(self) -> None: ...  # it outgrew the replay buffer: the attempt in flight is the last
    def body_complete(self) -> None: ...  # the whole body arrived and went to the attempts in flight


class ReadControl(Protocol):
    def pause_body(self) -> None: ...
    def resume_body(self) -> None: ...
    def pause_budget(self) -> None: ...  # unlike pause_body, a stall the body timeout counts
    def resume_budget(self) -> None: ...


class RequestBody:
    __slots__ = (
        "length",
        "chunked",
        "kept",
        "complete",
        "sinks",
        "paused_sinks",
        "pending",
        "attached",
        "discarding",
        "pausing",
        "control",
        "owner",
        "budget",
        "ticket",
        "starving",
    )

    def __init__(self, length: int | None, limit: int, control: ReadControl, budget: BufferBudget) -> None:
        """``length``: the declared ``Content-Length``, ``None`` when chunked."""
        self.budget = budget
        self.ticket = 0  # waiting for room in the budget (0: not)
        self.starving = False  # reading paused until the budget has room
        self.length = length
        self.chunked = length is None
        self.kept = ReplayBuffer(limit, replayable=length is None or length <= limit, budget=budget)
        self.complete = False
        self.sinks: list[BodySink] = []
        self.paused_sinks: set[int] = set()
        self.pending = 0  # bytes received that no attempt has taken yet
        self.attached = False
        self.discarding = False
        self.pausing = False
        self.control = control
        self.owner: BodyOwner | None = None  # told of the first attach, an overflow, the end

    @property
    def replayable(self) -> bool:
        return self.kept.replayable

    @property
    def dropped(self) -> bool:
        """Some of the body was let go: it cannot be sent from its start again."""
        return not self.kept.whole

    def restrict(self, limit: int) -> None:
        """Apply the route's own replay limit (the body began to arrive before the route was known)."""
        kept = self.kept
        kept.restrict(limit)
        if self.length is not None and self.length > limit:
            kept.seal()

    # -- from the client side ------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if self.discarding or not data:
            return
        kept = self.kept
        for s in self.sinks:
            s.body_data(data)
        if kept.replayable and kept.received + len(data) > kept.limit:
            kept.seal()
            if self.owner is not None:
                self.owner.body_overflowed()
        # kept while replayable, and until the first attempt takes it; past the limit, let go
        kept.add(data, keep=kept.replayable or not self.attached)
        if not self.sinks:
            self.pending += len(data)
        self._flow()

    def end(self) -> None:
        self.complete = True
        for s in self.sinks:
            s.body_end()
        self.sinks.clear()
        self._flow()
        if self.owner is not None:
            self.owner.body_complete()

    def discard(self) -> None:
        """The request is over (answered without its whole body): drop what comes, stop holding back."""
        self.discarding = True
        self.kept.let_go()
        self.sinks.clear()
        self.paused_sinks.clear()
        self.pending = 0
        self._flow()

    # -- from the attempts ---------------------------------------------------------------------------
    def attach(self, sink: BodySink) -> None:
        """Send the body to ``sink``: what has arrived now, the rest as it comes."""
        kept = self.kept
        kept.check_whole("the request body")
        if not self.attached:
            self.attached = True
            if self.owner is not None:
                self.owner.body_attached()
        for c in kept.pieces:
            sink.body_data(c)
        if not kept.replayable:
            kept.let_go()  # this attempt has it all; no other will
        if self.complete:
            sink.body_end()
        else:
            self.sinks.append(sink)
        self.pending = 0
        self._flow()

    def detach(self, sink: BodySink) -> None:
        if sink in self.sinks:
            self.sinks.remove(sink)
        self.paused_sinks.discard(id(sink))
        self._flow()

    def sink_paused(self, sink: BodySink) -> None:
        self.paused_sinks.add(id(sink))
        self._flow()

    def sink_resumed(self, sink: BodySink) -> None:
        self.paused_sinks.discard(id(sink))
        self._flow()

    def release(self) -> None:
        """The request is over: its kept chunks go, and so does their share of the budget."""
        self.kept.let_go()
        if self.ticket:
            self.budget.cancel(self.ticket)
            self.ticket = 0
        if self.starving:
            self.starving = False
            self.control.resume_budget()

    def _budget_room(self) -> None:
        self.ticket = 0
        self._flow()

    def _flow(self) -> None:
        starved = False
        if self.budget.full() and not self.complete and not self.discarding:
            starved = True
            if not self.ticket:
                self.ticket = self.budget.wait(0, self._budget_room)
        if starved != self.starving:
            self.starving = starved
            if starved:
                self.control.pause_budget()
            else:
                self.control.resume_budget()
        want = (
            not self.complete
            and not self.discarding
            and (bool(self.paused_sinks) or self.pending > WATERMARK)
        )
        if want != self.pausing:
            self.pausing = want
            if want:
                self.control.pause_body()
            else:
                self.control.resume_body()
