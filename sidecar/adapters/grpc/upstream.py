"""Channels to the upstream's endpoints: one ``grpc.aio`` channel per endpoint, made on first use, with
grpcio's own retries switched off (``grpc.enable_retries: 0``) so that only the sidecar retries. Calls are
raw bytes: no serializers."""

from __future__ import annotations

import grpc

_MULTICALLABLE_LIMIT = 4096


class Channels:
    def __init__(self, *, max_message_size: int, connect_timeout: float) -> None:
        self.options = (
            ("grpc.enable_retries", 0),
            ("grpc.max_send_message_length", max_message_size),
            ("grpc.max_receive_message_length", max_message_size),
            # Come back quickly after an endpoint restarts (grpc's default backoff grows to 120 s).
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
            ("grpc.min_reconnect_backoff_ms", max(100, int(connect_timeout * 1000))),
        )
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._unary: dict[tuple[str, str], grpc.aio.UnaryStreamMultiCallable] = {}
        self._stream: dict[tuple[str, str], grpc.aio.StreamStreamMultiCallable] = {}

    def channel(self, endpoint: str) -> grpc.aio.Channel:
        ch = self._channels.get(endpoint)
        if ch is None:
            ch = self._channels[endpoint] = grpc.aio.insecure_channel(endpoint, options=self.options)
        return ch

    def unary_stream(self, endpoint: str, method: str) -> grpc.aio.UnaryStreamMultiCallable:
        """For a request of one message (unary and server-streaming calls); the response may stream."""
        key = (endpoint, method)
        mc = self._unary.get(key)
        if mc is None:
            if len(self._unary) >= _MULTICALLABLE_LIMIT:
                self._unary.clear()
            mc = self._unary[key] = self.channel(endpoint).unary_stream(method)
        return mc

    def stream_stream(self, endpoint: str, method: str) -> grpc.aio.StreamStreamMultiCallable:
        key = (endpoint, method)
        mc = self._stream.get(key)
        if mc is None:
            if len(self._stream) >= _MULTICALLABLE_LIMIT:
                self._stream.clear()
            mc = self._stream[key] = self.channel(endpoint).stream_stream(method)
        return mc

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        self._unary.clear()
        self._stream.clear()
        for ch in channels:
            await ch.close()
