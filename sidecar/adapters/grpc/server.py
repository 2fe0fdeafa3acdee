"""The gRPC listener: a ``grpc.aio`` server with one catch-all generic handler that forwards any method as
raw bytes, whatever its shape (unary, server-, client- or bidi-streaming): every call is served as a
bidirectional stream and forwarded as ``request.py`` decides."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import grpc

from ...config import GrpcListenerConfig
from ...config.units import split_host_port
from ...services import Services, UpstreamRuntime
from .crash import POLL, GrpcioLog
from .request import Shared, proxy
from .routing import MethodRoutes
from .upstream import Channels

log = logging.getLogger("sidecar.grpc")
_HANDLER_CACHE_LIMIT = 4096


class _AnyMethod(grpc.GenericRpcHandler):
    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        h = self._handlers.get(method)
        if h is None:
            if len(self._handlers) >= _HANDLER_CACHE_LIMIT:
                self._handlers.clear()
            h = self._handlers[method] = grpc.stream_stream_rpc_method_handler(self._handler_of(method))
        return h

    def _handler_of(self, method: str) -> Callable[[object, grpc.aio.ServicerContext], Awaitable[None]]:
        """The method's handler: a coroutine function of its own (grpc.aio inspects the handler on every
        call, and a plain function is the cheapest to inspect; a ``functools.partial`` is unwrapped)."""

        async def handle(request_iterator: object, context: grpc.aio.ServicerContext) -> None:
            await proxy(self.shared, method, context)

        return handle


def _channels(config: GrpcListenerConfig, upstream: UpstreamRuntime) -> Channels:
    try:
        return Channels(
            max_message_size=config.max_message_size,
            connect_timeout=upstream.config.connect_timeout,
            tls=upstream.config.tls,
            endpoints=upstream.endpoints,
        )
    except OSError as e:
        raise OSError(f"listener {config.name!r}, upstream {config.upstream!r}: {e}") from None


def _shared(config: GrpcListenerConfig, services: Services, channels: Channels | None) -> Shared:
    upstream = services.upstream(config.upstream)  # the loader checked every name
    policy = config.policy or "grpc-a6"
    return Shared(
        listener=config.name,
        services=services,
        upstream=upstream,
        routes=MethodRoutes(config.method_policies, policy, config.method_timeouts, config.unary_requests),
        channels=channels if channels is not None else _channels(config, upstream),
        classifiers={},
        ways={},
    )


class GrpcListener:
    def __init__(self, config: GrpcListenerConfig, services: Services) -> None:
        self.name = config.name
        self.config = config
        self.shared = _shared(config, services, None)
        self._handler = _AnyMethod(self.shared)
        self._retired: list[Channels] = []  # channels to upstreams a reload changed: closed at stop
        self._server: grpc.aio.Server | None = None
        self._address: tuple[str, int] = split_host_port(config.listen)
        self._dead: list[grpc.aio.Server] = []  # loops died: their calls finish (_bury), or stop() ends them
        self._supervisor: asyncio.Task[None] | None = None
        self._rebuilding = False

    @property
    def serving(self) -> bool:
        """Accepting connections (False before start, after stop, and while a died server is rebuilt)."""
        return self._server is not None and self._supervisor is not None and not self._rebuilding

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    def reconfigure(self, config: GrpcListenerConfig, services: Services) -> None:
        """A reloaded config (same address and message size): calls from now on use it; calls in progress
        finish with what they began with. The channels carry over when the upstream did not change."""
        old = self.shared
        same = services.upstreams.get(config.upstream) is old.upstream
        self.shared = _shared(config, services, old.channels if same else None)
        if not same:
            old.channels.retire()
            self._retired.append(old.channels)
        self.config = config
        self._handler.shared = self.shared

    async def start(self) -> None:
        self._server = await self._serve(self.config.listen)
        self._supervisor = asyncio.get_running_loop().create_task(
            self._supervise(GrpcioLog.installed()), name=f"grpc {self.name}"
        )

    async def _serve(self, listen: str) -> grpc.aio.Server:
        size = self.config.max_message_size
        server = grpc.aio.server(
            options=(
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", size),
                ("grpc.max_send_message_length", size),
                ("grpc.max_connection_idle_ms", round(self.config.idle_timeout * 1000)),
                ("grpc.max_allowed_incoming_connections", self.config.max_connections),
            )
        )
        server.add_generic_rpc_handlers((self._handler,))
        host, _ = self._address
        try:
            port = server.add_insecure_port(listen)
        except RuntimeError as e:  # grpcio reports a failed bind this way
            raise OSError(f"listener {self.name!r}: cannot listen on {listen}: {e}") from None
        if port == 0:
            raise OSError(f"listener {self.name!r}: cannot listen on {listen}")
        try:
            await server.start()
        except BaseException:
            await server.stop(0)
            raise
        self._address = (host, port)
        return server

    async def _supervise(self, grpcio_log: GrpcioLog) -> None:
        """grpcio's server loop can die of one bad frame (``crash.py``): serve again on the same address."""
        while (server := self._server) is not None:
            cause = await grpcio_log.died(server)
            if self._server is not server:
                return  # stop() took it
            self._rebuilding = True
            self._dead.append(server)
            host, port = self._address
            log.error(
                "grpc listener %s: grpcio's server loop died (%s); its calls in progress finish, and it "
                "listens again on %s:%d",
                self.name,
                cause,
                host,
                port,
            )
            fresh = None
            while fresh is None:
                try:
                    fresh = await self._serve(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
                except OSError as e:  # the old socket may linger a moment
                    log.debug("grpc listener %s: not listening yet: %s", self.name, e)
                    await asyncio.sleep(POLL)
            self._server = fresh
            self._rebuilding = False
            asyncio.get_running_loop().create_task(self._bury(server))

    async def _bury(self, server: grpc.aio.Server) -> None:
        """A died server's calls in progress go on; once they ended, release it."""
        with contextlib.suppress(BaseException):  # its wait raises the cause, already logged
            await server.wait_for_termination()
        if server in self._dead:
            self._dead.remove(server)
            await server.stop(0)

    async def stop(self, grace: float) -> None:
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        server, self._server = self._server, None
        servers = [s for s in (server, *self._dead) if s is not None]
        self._dead.clear()
        await asyncio.gather(*(s.stop(grace) for s in servers), return_exceptions=True)
        for channels in [*self._retired, self.shared.channels]:
            await channels.close()
