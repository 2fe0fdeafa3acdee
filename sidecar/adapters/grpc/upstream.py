"""Channels to the upstream's endpoints: one ``grpc.aio`` channel per endpoint (per address: the sidecar, not
grpc's resolver, chooses the address of every call), made on first use, with grpcio's own retries switched off
(``grpc.enable_retries: 0``) so that only the sidecar retries. Calls are raw bytes: no serializers. With the
upstream's ``tls`` settings the channels use TLS (CA, client certificate, ``server_name`` as the name to
verify).

A channel to an address its upstream's name resolved to is made to that address, with the name as its
authority (``grpc.default_authority``): the upstream sees the ``:authority`` a channel to the name would
send, and TLS verifies the name. An address that leaves the upstream's set (``upstream/discovery.py``)
gets no new call; its channel is closed once its calls in flight ended (``drained``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from ...config.schema import TlsConfig
from ...upstream.discovery import UpstreamEndpoints

_MULTICALLABLE_LIMIT = 4096


class Channels:
    def __init__(
        self,
        *,
        max_message_size: int,
        connect_timeout: float,
        tls: TlsConfig | None = None,
        endpoints: UpstreamEndpoints | None = None,
    ) -> None:
        """``endpoints``: the upstream's set, which names each address and says when one left."""
        self.credentials = _credentials(tls)
        self.options: tuple[tuple[str, object], ...] = (
            ("grpc.enable_retries", 0),
            ("grpc.max_send_message_length", max_message_size),
            ("grpc.max_receive_message_length", max_message_size),
            # Come back quickly after an endpoint restarts (grpc's default backoff grows to 120 s).
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
            ("grpc.min_reconnect_backoff_ms", max(100, int(connect_timeout * 1000))),
        )
        if tls is not None and tls.server_name:
            self.options += (("grpc.ssl_target_name_override", tls.server_name),)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stream: dict[tuple[str, str], Any] = {}  # (endpoint, method) -> StreamStreamMultiCallable
        self._unary: dict[tuple[str, str], Any] = {}  # (endpoint, method) -> UnaryStreamMultiCallable
        self._endpoints = endpoints
        self._draining: dict[str, grpc.aio.Channel] = {}  # addresses that left, calls still in flight
        self._closing: set[asyncio.Task[None]] = set()
        if endpoints is not None:
            endpoints.watch(self)

    def channel(self, endpoint: str) -> grpc.aio.Channel:
        ch = self._channels.get(endpoint)
        if ch is None:
            ch = self._draining.get(endpoint)  # picked just before it left: its calls finish there
            if ch is None:
                ch = self._open(endpoint)
                if self._endpoints is None or self._endpoints.active(endpoint):
                    self._channels[endpoint] = ch
                else:
                    self._draining[endpoint] = ch
        return ch

    def _open(self, endpoint: str) -> grpc.aio.Channel:
        options = self.options
        name = self._endpoints.name_of(endpoint) if self._endpoints is not None else endpoint
        if name != endpoint:  # an address of a name: the upstream is told the name, TLS verifies it
            options = (*options, ("grpc.default_authority", name))
        if self.credentials is None:
            return grpc.aio.insecure_channel(endpoint, options=options)
        return grpc.aio.secure_channel(endpoint, self.credentials, options=options)

    # -- the upstream's set changed (an EndpointWatcher) ---------------------------------------------------
    def left(self, address: str) -> None:
        """``address`` left the set: no new call goes to it; its calls in flight go on."""
        ch = self._channels.pop(address, None)
        if ch is not None:
            self._draining[address] = ch
        self._forget_callables(address)

    def drained(self, address: str) -> None:
        """Nothing is in flight to ``address`` any more: its channel closes."""
        ch = self._draining.pop(address, None)
        self._forget_callables(address)
        if ch is not None:
            task = asyncio.get_running_loop().create_task(ch.close(), name=f"close channel {address}")
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _forget_callables(self, address: str) -> None:
        for cache in (self._stream, self._unary):
            for key in [k for k in cache if k[0] == address]:
                del cache[key]

    def stream_stream(self, endpoint: str, method: str) -> grpc.aio.StreamStreamMultiCallable:
        """A call goes upstream as a stream (unless its method is in ``unary_requests``): its request
        messages are forwarded as they arrive."""
        return self._callable(self._stream, endpoint, method, "stream_stream")

    def unary_stream(self, endpoint: str, method: str) -> grpc.aio.UnaryStreamMultiCallable:
        """A method whose request is one message (``unary_requests``): the response may still stream."""
        return self._callable(self._unary, endpoint, method, "unary_stream")

    def _callable(self, cache: dict[tuple[str, str], Any], endpoint: str, method: str, form: str) -> Any:
        """The channel's multi-callable of ``form`` for ``method``, made once (clients choose method names:
        the cache is bounded)."""
        key = (endpoint, method)
        mc = cache.get(key)
        if mc is None:
            if len(cache) >= _MULTICALLABLE_LIMIT:
                cache.clear()
            mc = cache[key] = getattr(self.channel(endpoint), form)(method)
        return mc

    def retire(self) -> None:
        """A reload gave the listener other channels: this set hears no more of the upstream's changes
        (``close`` follows at stop)."""
        if self._endpoints is not None:
            self._endpoints.unwatch(self)

    async def close(self) -> None:
        self.retire()
        channels = [*self._channels.values(), *self._draining.values()]
        self._channels, self._draining = {}, {}
        self._stream.clear()
        self._unary.clear()
        for ch in channels:
            await ch.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _credentials(tls: TlsConfig | None) -> grpc.ChannelCredentials | None:
    """TLS credentials from the upstream's ``tls`` settings; files are read once, at start."""
    if tls is None:
        return None
    if tls.insecure_skip_verify:
        raise OSError("tls.insecure_skip_verify is not supported for gRPC upstreams (grpcio always verifies)")
    if (tls.cert_file is None) != (tls.key_file is None):
        raise OSError("tls: a client certificate needs both cert_file and key_file")

    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise OSError(f"tls: cannot read {path!r}: {e.strerror or e}") from None

    return grpc.ssl_channel_credentials(read(tls.ca_file), read(tls.key_file), read(tls.cert_file))
