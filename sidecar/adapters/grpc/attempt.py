"""One attempt of a proxied call: send the request upstream, pass the response on once it is ours.

An attempt is *committed* (A6) when the upstream sent it response headers with metadata, or a message: the
attempt then takes the engine's commit (``AttemptContext.commit``) and claims the client
(``Downstream.claim``), and from then on its headers and messages go to the client as they come. Empty headers are not a commit: a grpc.aio client cannot tell
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

from ...policy import SendAttempt
from ...runtime import AttemptContext, AttemptResult
from ...telemetry.observer import RequestObserver
from .answer import CLIENT_GONE_STATUS, second_message
from .classify import CLIENT_GONE, CODE_NUMBER, LOST, SECOND_MESSAGE, GrpcClassifier, UpstreamStatus
from .downstream import Downstream
from .metadata import attempt_metadata
from .replay import EOF, RequestStream
from .upstream import Channels

log = logging.getLogger("sidecar.grpc")
_LOST = AttemptResult(LOST)
_CLIENT_GONE = AttemptResult(CLIENT_GONE, CLIENT_GONE_STATUS)


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
        single_request: bool = False,
    ) -> None:
        self.channels = channels
        self.method = method
        self.request = request
        self.metadata = metadata
        self.down = downstream
        self.classifier = classifier
        self.obs = observer
        self.deadline_header = deadline_header
        self.single_request = single_request  # the route is in ``unary_requests``: see OneMessage

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
        one: OneMessage | None = None
        if self.single_request:
            one = OneMessage(self.channels, cmd.endpoint, self.method, md, timeout)
            sink: Any = one
        else:
            sink = self.channels.stream_stream(cmd.endpoint, self.method)(metadata=md, timeout=timeout)
        writer = asyncio.get_running_loop().create_task(_write_request(self.request, sink, cmd, ctx))
        call = sink
        try:
            if one is not None:
                call = await one.started()
            # (a request written in one go has no write to fail: nothing to watch for)
            first_status = _watch_status(call) if one is None else []
            result = await self._receive(call, cmd, ctx, timeout is not None, first_status)
        except asyncio.CancelledError:
            if one is not None and not one.call.done():
                ctx.let_go()  # cancelled before the call started: the upstream holds nothing of it
            call.cancel()
            task = asyncio.current_task()
            if one is not None and one.second_message and task is not None and not task.cancelling():
                return _second_message(self.method)  # grpc raised it from the call the writer cancelled
            raise
        finally:
            self.request.stop(cmd.attempt, writer)  # (a read of the client in flight finishes first)
        if one is not None and one.second_message:
            return _second_message(self.method)
        return result

    async def _respond(self, call: Any, ctx: AttemptContext, initial: Any, n: int) -> AttemptResult | None:
        """This attempt has something for the client: claim the response (the first attempt to do so wins,
        A6's commit) and send its headers. ``None`` when it may go on; else the attempt's end."""
        if not (ctx.commit() and self.down.claim(n)):  # the engine's commit (A6), then the client
            call.cancel()
            return _LOST
        self.request.seal()  # committed: no attempt starts after this one
        try:
            await self.down.send_headers(initial, n)
        except Exception as e:  # noqa: BLE001 - grpc raises several types for a dead server call
            return _client_gone(call, e)
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
            try:
                await self.down.write(msg)
            except Exception as e:  # noqa: BLE001 - grpc raises several types for a dead server call
                return _client_gone(call, e)
        if first_status:
            code, details, trailing = first_status[0]
        elif call.done():  # (the usual case: read at once, without three awaits)
            code, details, trailing = (
                _ready(call.code()),
                _ready(call.details()),
                _ready(call.trailing_metadata()),
            )
        else:
            code, details, trailing = await call.code(), await call.details(), await call.trailing_metadata()
        trailing = tuple(trailing or ())
        status = UpstreamStatus(code, details or "", trailing, tuple(initial or ()))
        outcome = self.classifier.classify(
            code, details, trailing, responded=responded, had_deadline=had_deadline
        )
        self.obs.set_attempt_attribute(n, "rpc.grpc.status_code", CODE_NUMBER[code])
        return AttemptResult(outcome, status)


def _client_gone(call: Any, e: Exception) -> AttemptResult:
    """Passing the response to the client failed: the client is gone; the upstream call is abandoned too."""
    log.debug("passing a response to the client failed: %r", e)
    call.cancel()
    return _CLIENT_GONE


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
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.InternalError):
        # The call ended while we were writing: its status tells what happened. (grpcio raises an
        # InternalError, its ExecuteBatchError, for a half-close on a call that already ended: found by
        # fuzzing, tests/fuzz.)
        pass
    except SecondMessage:
        call.cancel()  # the attempt ends with the error saying so (OneMessage.second_message)
    except Exception:
        log.exception("sending the request stream of attempt %d failed", cmd.attempt)
        call.cancel()


# -- methods whose request is one message -----------------------------------------------------------------
class SecondMessage(Exception):
    """The client sent a second request message on a method listed in ``unary_requests``."""


class OneMessage:
    """The request side of an attempt whose method takes one request message (unary and server-streaming
    methods, listed in the listener's ``unary_requests``): the upstream call starts once that message is
    there, in grpc's single-request form (headers, message and half-close in one operation: cheaper for the
    sidecar than a stream, where each is an operation of its own). It takes the place of the stream call's
    ``write`` / ``done_writing`` for ``RequestStream.feed``, so replay, the buffer limit and
    ``RequestComplete`` work as for every call.

    A client that half-closes without a message gets the stream form (the upstream answers what it would);
    a second message means the method was listed wrongly: the call is cancelled and the attempt ends with
    an error saying so, rather than the upstream answering half a request."""

    __slots__ = ("channels", "endpoint", "method", "metadata", "timeout", "call", "second_message")

    def __init__(
        self, channels: Channels, endpoint: str, method: str, metadata: Any, timeout: float | None
    ) -> None:
        self.channels = channels
        self.endpoint = endpoint
        self.method = method
        self.metadata = metadata
        self.timeout = timeout
        self.call: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.second_message = False

    async def started(self) -> Any:
        """The upstream call, once the request's message (or its end) is there."""
        return await self.call

    async def write(self, message: bytes) -> None:
        if not self.call.done():
            mc = self.channels.unary_stream(self.endpoint, self.method)
            self.call.set_result(mc(message, metadata=self.metadata, timeout=self.timeout))
            return
        self.second_message = True
        raise SecondMessage

    async def done_writing(self) -> None:
        if not self.call.done():  # no message at all: as a stream of none
            mc = self.channels.stream_stream(self.endpoint, self.method)
            call = mc(metadata=self.metadata, timeout=self.timeout)
            self.call.set_result(call)
            await call.done_writing()

    def cancel(self) -> None:
        if self.call.done():
            self.call.result().cancel()
        else:
            self.call.cancel()


def _second_message(method: str) -> AttemptResult:
    return AttemptResult(SECOND_MESSAGE, second_message(method))
