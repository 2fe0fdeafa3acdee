"""The gRPC listener: a ``grpc.aio`` server with one catch-all generic handler that forwards any method as
raw bytes, whatever its shape (unary, server-, client- or bidi-streaming): every call is served as a
bidirectional stream and forwarded as ``request.py`` decides."""

from __future__ import annotations

import functools
import logging

import grpc

from ...config import GrpcListenerConfig, UpstreamConfig
from ...config.units import split_host_port
from ...services import Services
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
            h = self._handlers[method] = grpc.stream_stream_rpc_method_handler(
                functools.partial(self._handle, method)
            )
        return h

    async def _handle(self, method: str, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        await proxy(self.shared, method, context)


def _channels(config: GrpcListenerConfig, upstream: UpstreamConfig) -> Channels:
    try:
        return Channels(
            max_message_size=config.max_message_size,
            connect_timeout=upstream.connect_timeout,
            tls=upstream.tls,
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
        channels=channels if channels is not None else _channels(config, upstream.config),
        classifiers={},
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
            self._retired.append(old.channels)
        self.config = config
        self._handler.shared = self.shared

    async def start(self) -> None:
        size = self.config.max_message_size
        server = grpc.aio.server(
            options=(
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", size),
                ("grpc.max_send_message_length", size),
            )
        )
        server.add_generic_rpc_handlers((self._handler,))
        host, _ = self._address
        try:
            port = server.add_insecure_port(self.config.listen)
        except RuntimeError as e:  # grpcio reports a failed bind this way
            raise OSError(f"listener {self.name!r}: cannot listen on {self.config.listen}: {e}") from None
        if port == 0:
            raise OSError(f"listener {self.name!r}: cannot listen on {self.config.listen}")
        await server.start()
        self._server = server
        self._address = (host, port)

    async def stop(self, grace: float) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        for channels in [*self._retired, self.shared.channels]:
            await channels.close()
