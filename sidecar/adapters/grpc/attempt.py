"""One attempt of a proxied call: send the request upstream, pass the response on once it is ours.

An attempt is *committed* (A6) when the upstream sent it response headers with metadata, or a message: the
attempt then claims the client (``Downstream.claim``, which tells the engine), and from then on its headers
and messages go to the client as they come. Empty headers are not a commit: a grpc.aio client cannot tell
them apart from a trailers-only status (and may lose headers that arrive with the trailers), and nothing has
reached the client then, so the attempt may still be retried. A hedge that finds the client already claimed
by another attempt has lost: it is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Coroutine
from typing import Any

import grpc
from grpc._cython.cygrpc import ExecuteBatchError

from ...policy import Outcome, OutcomeClass, SendAttempt
from ...runtime import AttemptContext, AttemptResult
from ...telemetry.observer import RequestObserver
from .answer import Downstream, UpstreamStatus
from .classify import GrpcClassifier
from .metadata import attempt_metadata
from .replay import EOF, RequestStream
from .upstream import Channels

log = logging.getLogger("sidecar.grpc")
_LOST = AttemptResult(Outcome(OutcomeClass.FATAL, detail="another attempt answered first"))
_CLIENT_GONE = AttemptResult(
    Outcome(OutcomeClass.FATAL, detail="client gone"),
    UpstreamStatus(grpc.StatusCode.CANCELLED, "client gone"),
)


class Attempter:
    """Sends attempts of one call (``sidecar.runtime.Attempter``)."""

    def __init__(
        self,
        *,
        channels: Channels,
        method: str,
        request: RequestStream,
        metadata: list[tuple[str, str | bytes]],
        downstream: Downstream,
        classifier: GrpcClassifier,
        observer: RequestObserver,
        deadline_header: str | None,
    ) -> None:
        self.channels = channels
        self.method = method
        self.request = request
        self.metadata = metadata
        self.down = downstream
        self.classifier = classifier
        self.obs = observer
        self.deadline_header = deadline_header

    def discard(self, payload: Any) -> None:
        pass  # an UpstreamStatus holds no connection

    async def send(self, cmd: SendAttempt, ctx: AttemptContext) -> AttemptResult:
        timeout = cmd.timeout if math.isfinite(cmd.timeout) else None
        md = attempt_metadata(
            self.metadata,
            cmd.previous_attempts,
            ctx.headers,
            self.deadline_header,
            None if timeout is None else max(0, int(timeout * 1000)),
        )
        if cmd.attempt > 1:
            self.obs.set_attempt_attribute(cmd.attempt, "previous-rpc-attempts", cmd.previous_attempts)  # A45
        call = self.channels.stream_stream(cmd.endpoint, self.method)(metadata=md, timeout=timeout)
        first_status = _watch_status(call)
        writer = asyncio.get_running_loop().create_task(_write_request(self.request, call, cmd, ctx))
        try:
            return await self._receive(call, cmd, ctx, timeout is not None, first_status)
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            if not writer.done():
                writer.cancel()

    async def _respond(self, call: Any, ctx: AttemptContext, initial: Any, n: int) -> AttemptResult | None:
        """This attempt has something for the client: claim the response (the first attempt to do so wins,
        A6's commit) and send its headers. ``None`` when it may go on; else the attempt's end."""
        if not self.down.claim(ctx):
            call.cancel()
            return _LOST
        if not await self._pass(self.down.send_headers(initial, n), call):
            return _CLIENT_GONE
        return None

    async def _receive(
        self, call: Any, cmd: SendAttempt, ctx: AttemptContext, had_deadline: bool, first_status: list
    ) -> AttemptResult:
        n = cmd.attempt
        responded = False
        initial = await call.initial_metadata()
        if initial:
            lost = await self._respond(call, ctx, initial, n)
            if lost is not None:
                return lost
            responded = True
        while True:
            try:
                msg = await call.read()
            except grpc.aio.AioRpcError:
                break  # a non-OK status: read below
            except asyncio.InvalidStateError:
                break  # the stream-stream call ended under a failed write: the status tells
            if msg is EOF:
                break
            if not responded:
                lost = await self._respond(call, ctx, initial, n)
                if lost is not None:
                    return lost
                responded = True
            if not await self._pass(self.down.write(msg), call):
                return _CLIENT_GONE
        if first_status:
            code, details, trailing = first_status[0]
        else:
            code, details, trailing = await call.code(), await call.details(), await call.trailing_metadata()
        trailing = tuple(trailing or ())
        status = UpstreamStatus(code, details or "", trailing, tuple(initial or ()))
        outcome = self.classifier.classify(
            code, details, trailing, responded=responded, had_deadline=had_deadline
        )
        self.obs.set_attempt_attribute(n, "rpc.grpc.status_code", code.value[0])
        return AttemptResult(outcome, status)

    @staticmethod
    async def _pass(send: Coroutine[Any, Any, None], call: Any) -> bool:
        """Send to the client; if that fails, the client is gone: abandon the upstream call too."""
        try:
            await send
        except Exception as e:  # noqa: BLE001 - grpc raises several types for a dead server call
            log.debug("passing a response to the client failed: %r", e)
            call.cancel()
            return False
        return True


def _watch_status(call: Any) -> list:
    """The first status the call reports. grpc.aio (grpc issue 36066) may overwrite an upstream's early
    status with ``INTERNAL "Internal error from Core"`` when a request write fails because the upstream has
    already ended the call; done callbacks run at every status change, so the first one is kept here."""
    box: list = []

    def done(c: Any) -> None:
        if box:
            return
        try:  # runs inside grpc's status handling: never raise there
            box.append((_ready(c.code()), _ready(c.details()), _ready(c.trailing_metadata())))
        except Exception:  # noqa: BLE001 - then the status is read the ordinary way
            log.debug("could not keep the first status of a call", exc_info=True)

    call.add_done_callback(done)
    return box


def _ready(coro: Coroutine[Any, Any, Any]) -> Any:
    """The value of a call accessor once the call is done (it completes without suspending then)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("call accessor suspended on a finished call")


async def _write_request(request: RequestStream, call: Any, cmd: SendAttempt, ctx: AttemptContext) -> None:
    try:
        await request.feed(cmd.attempt, call.write, call.done_writing, ctx.buffer_exceeded)
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError, ExecuteBatchError):
        # The call ended while we were writing: its status tells what happened. (grpcio raises its internal
        # ExecuteBatchError for a half-close on a call that already ended: found by fuzzing, tests/fuzz.)
        pass
    except Exception:
        log.exception("sending the request stream of attempt %d failed", cmd.attempt)
        call.cancel()
