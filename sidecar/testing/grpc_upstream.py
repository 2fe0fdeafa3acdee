"""A scriptable gRPC upstream for tests, the demo and benchmarks: a ``grpc.aio`` server with one generic
handler (any method, raw bytes) that answers each call from a script and records what it saw.

Each call takes the next :class:`Step` from the script (or the default step): it may send headers, wait,
reply, stream replies, fail with a status and pushback, or fail before reading the request. By default a
call replies once with its request messages joined (an echo), which suits unary and client-streaming calls;
``replies=n`` streams n copies; ``echo_each`` answers each message as it arrives (bidi ping-pong).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

Metadata = Sequence[tuple[str, str | bytes]]


@dataclass(frozen=True)
class Step:
    code: grpc.StatusCode = grpc.StatusCode.OK
    details: str = ""
    pushback: str | Sequence[str] | None = None  # grpc-retry-pushback-ms value(s)
    trailing: Metadata = ()
    headers: Metadata | None = None  # send these as response headers first
    delay: float = 0.0  # wait this long before answering (benchmarks and the demo)
    hold: asyncio.Event | None = None  # wait for this before answering (tests: no sleeps)
    replies: int = 1
    echo_each: bool = False
    early: bool = False  # answer before reading the request
    read: int | None = None  # answer after this many request messages (not waiting for the stream's end)
    reply_before_failing: bool = False  # send the replies, then end with ``code``


def fail(code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE, **kw: object) -> Step:
    return Step(code=code, details=kw.pop("details", f"injected {code.name}"), **kw)  # type: ignore[arg-type]


@dataclass
class Seen:
    """One call as the upstream saw it."""

    method: str
    metadata: dict[str, str | bytes]
    requests: list[bytes] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    read_all: asyncio.Event = field(default_factory=asyncio.Event)  # the request stream ended
    time_remaining: float | None = None

    @property
    def previous_attempts(self) -> str | None:
        v = self.metadata.get("grpc-previous-rpc-attempts")
        return v if v is None or isinstance(v, str) else v.decode()


class GrpcUpstream:
    """``default``: the step for calls the script does not cover, or a function of the method choosing one
    per call (random faults for the demo and benchmarks). ``keep_records=False`` keeps no :class:`Seen` (long runs)."""

    def __init__(
        self,
        default: Step | Callable[[str], Step] | None = None,
        host: str = "127.0.0.1",
        keep_records: bool = True,
        tls: tuple[bytes, bytes] | None = None,
        port: int = 0,
    ) -> None:
        """``port``: 0 for a free one (a name's addresses in tests share one port on 127.0.0.2, .3, ...)."""
        self.default = default or Step()
        self.script: deque[Step] = deque()
        self.calls: list[Seen] = []
        self.count = 0
        self.in_flight = 0  # calls being answered now
        self.peak_in_flight = 0  # the most at once
        self.keep_records = keep_records
        self.tls = tls
        self.host = host
        self.port = port
        self._server: grpc.aio.Server | None = None
        self._arrived = asyncio.Condition()

    # -- scripting -------------------------------------------------------------------------------------
    def then(self, *steps: Step) -> GrpcUpstream:
        self.script.extend(steps)
        return self

    def fail_next(
        self, n: int, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE, **kw: object
    ) -> GrpcUpstream:
        return self.then(*(fail(code, **kw) for _ in range(n)))

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def previous_attempts(self) -> list[str | None]:
        return [c.previous_attempts for c in self.calls]

    async def wait_requests(self, call: int, n: int) -> list[bytes]:
        """Until call ``call`` (0-based) has received ``n`` request messages."""
        async with self._arrived:
            await self._arrived.wait_for(
                lambda: len(self.calls) > call and len(self.calls[call].requests) >= n
            )
        return self.calls[call].requests

    async def wait_in_flight(self, n: int) -> None:
        """Until ``n`` calls are being answered at once."""
        async with self._arrived:
            await self._arrived.wait_for(lambda: self.in_flight >= n)

    async def wait_calls(self, n: int) -> list[Seen]:
        async with self._arrived:
            await self._arrived.wait_for(lambda: len(self.calls) >= n)
        return self.calls

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> GrpcUpstream:
        server = grpc.aio.server(options=(("grpc.so_reuseport", 0),))
        server.add_generic_rpc_handlers((_Any(self),))
        address = f"{self.host}:{self.port}"
        if self.tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, grpc.ssl_server_credentials([self.tls]))
        if port == 0:
            raise OSError(f"cannot listen on {address}")
        self.port = port
        await server.start()
        self._server = server
        return self

    async def stop(self, grace: float | None = 0) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    async def __aenter__(self) -> GrpcUpstream:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- serving ---------------------------------------------------------------------------------------
    async def serve(self, method: str, context: grpc.aio.ServicerContext) -> None:
        seen = Seen(method, {m.key: m.value for m in context.invocation_metadata() or ()})
        seen.time_remaining = context.time_remaining()
        context.add_done_callback(lambda _: seen.finished.set())
        if self.script:
            step = self.script.popleft()
        else:
            step = self.default if isinstance(self.default, Step) else self.default(method)
        self.count += 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        if self.keep_records:
            self.calls.append(seen)
        try:
            async with self._arrived:
                self._arrived.notify_all()
            await self._answer(step, seen, context)
        except asyncio.CancelledError:  # the caller cancelled the call (or its deadline passed)
            seen.cancelled.set()
            raise
        finally:
            self.in_flight -= 1

    async def _answer(self, step: Step, seen: Seen, context: grpc.aio.ServicerContext) -> None:
        if not step.early:
            while step.read is None or len(seen.requests) < step.read:
                msg = await context.read()
                if msg is grpc.aio.EOF:
                    seen.read_all.set()
                    break
                seen.requests.append(msg)
                async with self._arrived:
                    self._arrived.notify_all()
                if step.echo_each:
                    await context.write(msg)
        if step.headers is not None:
            await context.send_initial_metadata(tuple(step.headers))
        if step.hold is not None:
            await step.hold.wait()
        if step.delay:
            await asyncio.sleep(step.delay)
        if (step.code is grpc.StatusCode.OK or step.reply_before_failing) and not step.echo_each:
            body = b"".join(seen.requests)
            for _ in range(step.replies):
                await context.write(body)
        trailing = list(step.trailing)
        if step.pushback is not None:
            values = [step.pushback] if isinstance(step.pushback, str) else list(step.pushback)
            trailing.extend(("grpc-retry-pushback-ms", v) for v in values)
        if trailing:
            context.set_trailing_metadata(tuple(trailing))
        if step.code is not grpc.StatusCode.OK:
            context.set_code(step.code)
            context.set_details(step.details)


class _Any(grpc.GenericRpcHandler):
    def __init__(self, upstream: GrpcUpstream) -> None:
        self.upstream = upstream

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method

        async def handle(_requests: object, context: grpc.aio.ServicerContext) -> None:
            await self.upstream.serve(method, context)

        return grpc.stream_stream_rpc_method_handler(handle)
